"""hydra-edge android-app: a real APK from a small android bundle, checked with apksigner and aapt; bad input refused.

The bundle is compact (3 heads as a recipe over the 12 heads' .pte): the APK must carry that one weight
set, and its DEX must reach the switcher library (Switcher, Rebuild) and no invoke-custom.

The APK is built as a user builds it (javac against Android's framework classes, dx, aapt, zipalign,
apksigner) and inspected, never launched: there is no phone or emulator here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Sequence

import msgspec
import pytest
from click.testing import CliRunner
from support.android_runtime import phone_table
from support.compact import android_bundle
from support.tables import fake_bundle

from hydra_edge.android import apk, dex
from hydra_edge.atomic import sha256_file
from hydra_edge.commands.android_app import android_app
from hydra_edge.lut.policy import Policy, ThermalPolicy
from hydra_edge.records.manifest import bundle_files, read_manifest

pytestmark = pytest.mark.slow  # converts a bundle and builds an APK


def lut_for(bundle: Path, out: Path, thermal: ThermalPolicy | None = None) -> Path:
    """lut.json for ``bundle`` whose 12 ms budget only the fewest heads meet (on ``thermal``'s policy)."""
    return phone_table(bundle, out, budget_ms=12.0, thermal=thermal)


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


def build(bundle: Path, lut: Path, out: Path, *key: str) -> tuple[int, str]:
    result = CliRunner().invoke(android_app, ["--bundle", str(bundle), "--lut", str(lut), "--out", str(out), *key])
    return result.exit_code, result.output


STORE_PASS, KEY_PASS = "store-secret-1", "key-secret-2"


@pytest.fixture(scope="module")
def release_keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Keystores as a user makes a release key (docs/android.md), by the JDK's keytool: release.jks, whose key
    has a password of its own, and release.p12 (PKCS12: one password), which also holds a certificate alone."""
    folder = tmp_path_factory.mktemp("keys")
    env = {**os.environ, "S": STORE_PASS, "K": KEY_PASS}

    def keytool(*args: str) -> None:
        subprocess.run(["keytool", *args, "-storepass:env", "S"], env=env, check=True, capture_output=True)

    make = ["-genkeypair", "-keyalg", "RSA", "-keysize", "2048", "-validity", "400", "-alias", "release"]
    keytool(*make, "-keystore", str(folder / "release.jks"), "-storetype", "JKS", "-keypass:env", "K",
            "-dname", "CN=hydra-edge release test")
    keytool(*make, "-keystore", str(folder / "release.p12"), "-storetype", "PKCS12", "-dname", "CN=p12 test")
    keytool("-exportcert", "-rfc", "-keystore", str(folder / "release.p12"), "-alias", "release",
            "-file", str(folder / "release.pem"))
    keytool("-importcert", "-noprompt", "-keystore", str(folder / "release.p12"), "-alias", "ca",
            "-file", str(folder / "release.pem"))
    (folder / "key-pass").write_text(KEY_PASS + "\n")
    return folder


def recording(tools: tuple[str, ...], into: Path) -> Path:
    """A folder of wrappers that log each call's argv (one JSON list a line) and run the real tool, to put
    first on PATH: what every keytool and apksigner process was given on its command line."""
    folder = into / "bin"
    folder.mkdir()
    for tool in tools:
        wrapper = folder / tool
        wrapper.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                           f"with open({str(into / 'argv.jsonl')!r}, 'a') as f:\n"
                           "    f.write(json.dumps(sys.argv) + '\\n')\n"
                           f"os.execv({shutil.which(tool)!r}, [{tool!r}, *sys.argv[1:]])\n")
        wrapper.chmod(0o755)
    return folder


def badging(path: Path) -> str:
    return subprocess.run(["aapt", "dump", "badging", str(path)], capture_output=True, text=True, check=True).stdout


def test_the_apk_is_signed_installable_and_carries_the_bundle_the_manifest_names(
        bundle: Path, release_keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built as a release is: the user's own key (a JKS whose key has its own password), the store password
    from the environment and the key's from a file; no password on any keytool or apksigner command line."""
    out = tmp_path / "out" / "demo.apk"
    out.parent.mkdir()
    monkeypatch.setenv("RELEASE_PASS", STORE_PASS)
    monkeypatch.setenv("PATH", f"{recording(('keytool', 'apksigner'), tmp_path)}{os.pathsep}{os.environ['PATH']}")
    code, output = build(bundle, bundle.parent / "lut.json", out, "--keystore", str(release_keys / "release.jks"),
                         "--key-alias", "release", "--ks-pass", "env:RELEASE_PASS",
                         "--key-pass", f"file:{release_keys / 'key-pass'}")
    assert code == 0, output
    assert f"wrote {out}" in output and [p.name for p in out.parent.iterdir()] == ["demo.apk"]
    assert "runtime check: 3 heads: max |diff|" in output and "runtime check: 12 heads: max |diff|" in output
    calls = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    assert [c[1] for c in calls] == ["-list", "sign", "sign", "verify"]  # the key checked (a probe signed), then used
    assert not [c for c in calls if any(STORE_PASS in a or KEY_PASS in a for a in c)], calls
    assert STORE_PASS not in output and KEY_PASS not in output

    # the schemes minSdk 26 needs and no more: v2 (Android 7.0+), v3 (9+, key rotation); no v1 JAR signature
    verify = subprocess.run(["apksigner", "verify", "--print-certs", "-v", str(out)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    schemes = dict(re.findall(r"^Verified using (v\d) scheme .*: (true|false)$", verify.stdout, re.M))
    assert schemes == {"v1": "false", "v2": "true", "v3": "true", "v4": "false"}, verify.stdout
    assert "Signer #1 certificate DN: CN=hydra-edge release test" in verify.stdout
    with zipfile.ZipFile(out) as z:
        assert not [n for n in z.namelist() if n.startswith("META-INF/")]  # no JAR signature files

    # package, version and SDK levels: written into the manifest aapt read, the Gradle build's values
    info = badging(out)
    assert f"package: name='{apk.PACKAGE}' versionCode='{apk.VERSION_CODE}' versionName='{apk.VERSION_NAME}'" in info
    assert f"sdkVersion:'{apk.MIN_SDK}'" in info and f"targetSdkVersion:'{apk.TARGET_SDK}'" in info
    assert (apk.MIN_SDK, apk.TARGET_SDK) == (26, 34)
    tree = subprocess.run(["aapt", "dump", "xmltree", str(out), "AndroidManifest.xml"], capture_output=True,
                          text=True, check=True).stdout
    assert re.search(r"android:extractNativeLibs\(0x[0-9a-f]+\)=\(type 0x12\)0xffffffff", tree), tree
    with zipfile.ZipFile(out) as z:  # targetSdk 30+: the phone refuses a compressed or unaligned resources.arsc
        arsc = z.getinfo("resources.arsc")
        assert arsc.compress_type == zipfile.ZIP_STORED
        with open(out, "rb") as f:
            f.seek(arsc.header_offset + 26)
            name_len, extra_len = struct.unpack("<HH", f.read(4))
        assert (arsc.header_offset + 30 + name_len + extra_len) % 4 == 0
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


def expect_refused(bundle: Path, lut: Path, out: Path, *words: str, key: Sequence[str] = ()) -> None:
    code, output = build(bundle, lut, out, *key)
    assert code != 0
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), output
    for word in words:
        assert word in lines[0], output
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*")), list(out.parent.iterdir())
    assert STORE_PASS not in output and KEY_PASS not in output


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


def test_a_table_not_on_the_thermal_status_is_refused(bundle: Path, tmp_path: Path) -> None:
    """The app passes PowerManager's thermal status to the table: a table banded in °C would read SHUTDOWN
    (6) as 6 °C, the coolest band. Refused even for a bundle whose target names no thermal signal."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    manifest = read_manifest(copy)
    manifest.target = {**manifest.target, "signals": {"commands": {"battery": "dumpsys battery"}}}
    manifest.write(copy)
    lut = lut_for(copy, tmp_path / "lut.json", msgspec.structs.replace(Policy().thermal, source="temperature"))
    assert json.loads(lut.read_text())["thermal"]["source"] == "temperature"
    expect_refused(copy, lut, tmp_path / "out" / "demo.apk", "$.thermal.source", "'temperature'",
                   "the Android thermal status", "re-run hydra-edge lut")


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


# --- signing with your own key: checked before anything is built ------------------------------------------


@pytest.mark.parametrize("case, words", [
    ("no keystore", ("keystore", "missing.jks not found", "making a release key")),
    ("not a keystore", ("cannot be read by keytool", "JKS or PKCS12")),
    ("wrong store password", ("the store password (--ks-pass) is wrong",)),
    ("wrong alias", ("has no alias 'relase'", "give --key-alias one of release")),
    ("a certificate alias", ("alias 'ca' holds a trustedCertEntry, not a private key",)),
    ("key password left out", ("the password of key 'release' is wrong (--key-pass",)),
    ("wrong key password", ("the password of key 'release' is wrong (--key-pass",)),
    ("variable not set", ("--ks-pass env:NO_SUCH_PASS: NO_SUCH_PASS is not set or empty",)),
    ("no password file", ("--key-pass file:", "cannot read it (FileNotFoundError", "first line is the password")),
    ("password as it was", ("--ks-pass takes env:NAME, file:PATH or pass:PASSWORD",)),
])
def test_a_key_that_cannot_sign_is_one_line_within_seconds(bundle: Path, release_keys: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, case: str,
                                                           words: tuple[str, ...]) -> None:
    """Each fault of the keystore, alias or passwords ends the command in one line naming it, before the
    build's first step (a valid bundle, and no fetch, javac or dx run), and no password is shown."""
    monkeypatch.setenv("RELEASE_PASS", STORE_PASS)
    (tmp_path / "wrong").write_text("not-the-key-pass\n")
    (tmp_path / "not.jks").write_bytes(b"PK\x03\x04 an APK, not a keystore")
    store, alias = release_keys / "release.jks", "release"
    ks, key = "env:RELEASE_PASS", f"file:{release_keys / 'key-pass'}"
    if case == "no keystore":
        store = tmp_path / "missing.jks"
    elif case == "not a keystore":
        store = tmp_path / "not.jks"
    elif case == "wrong store password":
        ks = f"file:{tmp_path / 'wrong'}"
    elif case == "wrong alias":
        alias = "relase"
    elif case == "a certificate alias":
        store, alias, key = release_keys / "release.p12", "ca", ks
    elif case == "wrong key password":
        key = f"file:{tmp_path / 'wrong'}"
    elif case == "variable not set":
        ks = "env:NO_SUCH_PASS"
    elif case == "no password file":
        key = f"file:{tmp_path / 'no-such-file'}"
    elif case == "password as it was":
        ks = STORE_PASS  # the old --key-pass took the password bare
    args = ["--keystore", str(store), "--key-alias", alias, "--ks-pass", ks]
    args += [] if case == "key password left out" else ["--key-pass", key]
    began = time.monotonic()
    expect_refused(bundle, bundle.parent / "lut.json", tmp_path / "out" / "demo.apk", *words, key=args)
    took = time.monotonic() - began
    assert took < 15  # keytool and an apksigner probe: seconds, not the build's minutes


def test_signing_options_need_their_keystore(bundle: Path, tmp_path: Path) -> None:
    lut = bundle.parent / "lut.json"
    code, output = build(bundle, lut, tmp_path / "demo.apk", "--keystore", "k.jks", "--key-alias", "release")
    assert code == 2 and "--keystore needs --ks-pass" in output
    code, output = build(bundle, lut, tmp_path / "demo.apk", "--ks-pass", "env:X")
    assert code == 2 and "give --keystore too" in output
    assert not list(tmp_path.iterdir())


def test_the_debug_key_is_made_once_and_signs(tmp_path: Path) -> None:
    """Without --keystore: a PKCS12 key made by keytool in the config folder, checked as a user's key is."""
    key = apk.debug_key()
    assert key.store == apk.config_dir() / "android-debug.keystore" and key.store.is_file()
    made = key.store.stat().st_mtime_ns
    apk.check_key(key)
    assert apk.debug_key() == key and key.store.stat().st_mtime_ns == made


# --- one manifest, two builds ------------------------------------------------------------------------------


def test_the_gradle_build_and_the_sdkless_one_declare_the_same_app() -> None:
    """The manifest has no package= or <uses-sdk> (the Android Gradle plugin 8 refuses the one and ignores the
    other); build.gradle declares what apk.py writes into its copy (the built APK's badging shows apk.py's)."""
    manifest = (apk.APP / "app" / "src" / "main" / "AndroidManifest.xml").read_text()
    body = re.sub(r"<!--.*?-->", "", manifest, flags=re.S)
    assert "package=" not in body and "<uses-sdk" not in body and "extractNativeLibs" not in body
    assert "versionCode" not in body and "versionName" not in body
    gradle = (apk.APP / "app" / "build.gradle").read_text()

    def declared(name: str) -> str:
        found = re.findall(rf"^\s*{name}\s+\"?([^\"\s]+)\"?\s*$", gradle, re.M)
        assert len(found) == 1, (name, found)
        return found[0]

    assert declared("namespace") == declared("applicationId") == apk.PACKAGE
    assert (declared("minSdk"), declared("targetSdk")) == (str(apk.MIN_SDK), str(apk.TARGET_SDK))
    assert (declared("versionCode"), declared("versionName")) == (str(apk.VERSION_CODE), apk.VERSION_NAME)
    assert "useLegacyPackaging true" in gradle  # extractNativeLibs, as apk.py writes it
    assert (apk.APP / "README.md").is_file()
