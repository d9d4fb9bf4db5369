"""Build the Android demo APK (apps/android-demo/app) without Gradle or Google's Maven.

The chain, every part from Maven Central, npm or Debian:

* compile: ``javac --release 8`` against Robolectric's ``android-all`` (the Android 11 framework
  classes) and the ExecuTorch Android classes; R.java from Debian's ``aapt`` against Debian's
  ``framework-res.apk`` (API 29);
* check: every head count the APK carries (compact ones rebuilt) run on its golden inputs in the x86_64 build
  of the runtime the APK ships, on this host (``host_runtime.py``), before anything is packaged;
* dex: ``dalvik-dx`` (Java 8 bytecode, min API 26) over the app, the ExecuTorch classes, fbjni,
  nativeloader, and the switcher library's jar with the kotlin-stdlib classes it names (``dex.py``);
  the DEX is refused if the app or the library can reach an ``invoke-custom``;
* package: ``aapt`` (manifest, resources, assets: the bundle and lut.json), then classes.dex and
  ``lib/<abi>/*.so`` (ExecuTorch's JNI library, fbjni, libc++_shared), ``zipalign -p 4``,
  ``apksigner`` (v2 + v3) with a key made once by ``keytool`` and kept in the user's config folder.

ExecuTorch's Android runtime is not on Maven Central here; react-native-executorch 0.8.5 on npm ships
its prebuilt JNI library (arm64-v8a, x86_64) and Java classes (Java 8 bytecode, which dx reads), and
that runtime knows every XNNPACK node type executorch 1.5.1 writes (docs/android.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..atomic import atomic_path, sha256_file, write_json
from ..errors import HydraEdgeError
from ..records.manifest import MANIFEST, bundle_files, read_manifest
from . import dex, host_runtime

APP = Path(__file__).resolve().parents[2] / "apps" / "android-demo"
PACKAGE = "org.hydraedge.demo"
MIN_SDK, TARGET_SDK = 26, 29
FRAMEWORK_RES = Path("/usr/share/android-framework-res/framework-res.apk")
# Maven Central: (group, artifact, version, packaging); fetched by mvn into ~/.m2, no transitive deps.
MAVEN = {
    "android-all": ("org.robolectric", "android-all", "11-robolectric-6757853", "jar"),
    "dx": ("com.jakewharton.android.repackaged", "dalvik-dx", "16.0.1", "jar"),
    "fbjni": ("com.facebook.fbjni", "fbjni", "0.7.0", "aar"),
    "nativeloader": ("com.facebook.soloader", "nativeloader", "0.10.5", "jar"),
}
NPM_EXECUTORCH = ("react-native-executorch", "0.8.5")
ABIS = ("arm64-v8a", "x86_64")  # what both the ExecuTorch build and fbjni carry
TOOLS = {"javac": "default-jdk-headless", "java": "default-jdk-headless", "keytool": "default-jdk-headless",
         "mvn": "maven", "npm": "npm", "aapt": "aapt", "zipalign": "zipalign", "apksigner": "apksigner"}
KEY_ALIAS, KEY_PASS = "hydra-edge", "hydra-edge"


def config_dir() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "hydra-edge"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hydra-edge" / "android"


def check_tools() -> None:
    """Every program the build runs, before any work: one line naming what is missing and its package."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        packages = " ".join(sorted({TOOLS[t] for t in missing}))
        raise HydraEdgeError(f"{', '.join(missing)} not found; building the Android app needs them: "
                             f"sudo apt-get install {packages} (or run ./install.sh as root)")
    if not FRAMEWORK_RES.is_file():
        raise HydraEdgeError(f"{FRAMEWORK_RES} not found; aapt links the app against it: "
                             "sudo apt-get install android-framework-res")


def _run(argv: Sequence[str | Path], what: str, cwd: Optional[Path] = None) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        tail = next((line for line in reversed(said) if "ERROR" in line or "error" in line), said[-1] if said else "")
        raise HydraEdgeError(f"{what} failed (exit {done.returncode}): {tail.strip()[:300]}")
    return done.stdout


def maven_part(name: str) -> Path:
    """A Maven Central part in ~/.m2, fetched by mvn when absent."""
    group, artifact, version, kind = MAVEN[name]
    path = (Path.home() / ".m2" / "repository" / Path(*group.split(".")) / artifact / version
            / f"{artifact}-{version}.{kind}")
    if not path.is_file():
        _run(["mvn", "-q", "-B", "dependency:get", f"-Dartifact={group}:{artifact}:{version}:{kind}",
              "-Dtransitive=false"], f"fetching {group}:{artifact}:{version} from Maven Central")
    if not path.is_file():
        raise HydraEdgeError(f"mvn did not leave {path}; check Maven Central is reachable (mvn -v, ~/.m2/settings.xml)")
    return path


def executorch_runtime() -> Path:
    """react-native-executorch's npm tarball, unpacked once under the cache folder: its package/ folder."""
    name, version = NPM_EXECUTORCH
    root = cache_dir() / f"{name}-{version}"
    done = root / "package" / "android" / "libs" / "classes.jar"
    if not done.is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
            _run(["npm", "pack", "--silent", f"{name}@{version}"], f"fetching {name}@{version} from npm", cwd=Path(tmp))
            tgz = next(Path(tmp).glob("*.tgz"))
            unpack = Path(tmp) / "x"
            unpack.mkdir()
            members = ["package/android/libs/classes.jar"] + [
                f"package/third-party/android/libs/executorch/{abi}/libexecutorch.so" for abi in ABIS]
            _run(["tar", "xzf", tgz, "-C", unpack, *members], f"unpacking {tgz.name}")
            shutil.rmtree(root, ignore_errors=True)
            os.replace(unpack, root)
    return root / "package"


def core_jars() -> List[Path]:
    """The switcher library (apps/android-demo/core) and what it needs at run time (kotlin-stdlib), built by mvn.

    org.json is left out: Android has it. The jars' Java 9+ entries (module-info) are left out too: dx reads Java 8."""
    pom = APP / "core" / "pom.xml"
    if not pom.is_file():
        raise HydraEdgeError(f"{pom} not found; build the app from a hydra-edge checkout (git clone, then ./install.sh)")
    _run(["mvn", "-q", "-B", "-f", pom, "package", "-DskipTests"], "building the switcher library (mvn package)")
    target = APP / "core" / "target"
    jars = sorted(p for p in target.glob("*.jar") if not p.name.endswith(("-sources.jar", "-javadoc.jar")))
    classpath = (target / "classpath.txt").read_text().strip() if (target / "classpath.txt").is_file() else ""
    deps = [Path(p) for p in classpath.split(os.pathsep) if p]
    keep = [p for p in deps if not p.name.startswith(("json-", "annotations-"))]
    if not jars:
        raise HydraEdgeError(f"mvn package left no jar in {target}; run mvn -f {pom} package to see why")
    return jars + keep


def shrunk_core(core: Sequence[Path], app_classes: Path, tmp: Path) -> List[Path]:
    """The switcher library's jar whole, and of each jar it needs (kotlin-stdlib) only the classes the app and
    the library name, transitively (dex.needed_classes); Java 9+ entries left out, as dx reads Java 8."""
    own = dex.jar_classes(core[0])
    roots = list(own.values()) + [p.read_bytes() for p in app_classes.rglob("*.class")]
    out = [dex.write_jar(own, set(own), tmp / "core.jar")]
    for i, jar in enumerate(core[1:]):
        classes = dex.jar_classes(jar)
        out.append(dex.write_jar(classes, dex.needed_classes(roots, classes), tmp / f"dep{i}-{jar.name}"))
    return out


def runtime_parts(et: Path, parts: Dict[str, Path]) -> host_runtime.Parts:
    """The runtime the APK ships, as ``host_runtime`` runs it: the same files ``build_apk`` packages."""
    return host_runtime.Parts(executorch_library=et / "third-party" / "android" / "libs" / "executorch" / "x86_64"
                              / "libexecutorch.so", executorch_classes=et / "android" / "libs" / "classes.jar",
                              fbjni_aar=parts["fbjni"], nativeloader=parts["nativeloader"])


def check_dex(path: Path) -> None:
    """No invoke-custom / invoke-polymorphic that the app, the switcher library or ExecuTorch's classes can
    reach: Android has no LambdaMetafactory, so such a call site fails the first time it runs."""
    parents: Dict[tuple, Optional[tuple]] = {}
    found = dex.reachable_call_sites(dex.read_dex(path.read_bytes()), parents=parents)
    if found:
        where, op = found[0]
        raise HydraEdgeError(f"classes.dex: {op} in {where[0][1:-1]}.{where[1]}, reached by "
                             f"{' -> '.join(dex.path_to(parents, where))}; Android cannot run it: compile the switcher "
                             "library with -Xlambdas=class -Xsam-conversions=class and avoid the library call that reaches it")


@dataclass(frozen=True)
class Checked:
    """The bundle files that go into the APK (name in the bundle -> file), and the table."""
    files: Dict[str, Path]
    lut: Path
    manifest_sha256: str


def check_inputs(bundle: Path, lut: Path) -> Checked:
    """An android (.pte) bundle, intact, and a table built for it; one line otherwise."""
    from ..runtime.lut import read_table

    manifest = read_manifest(bundle)
    target = manifest.target.get("name")
    foreign = [a for a in manifest.artefacts if a.format != "executorch"]
    if foreign or not manifest.artefacts:
        what = f"holds {foreign[0].file} ({foreign[0].format})" if foreign else "holds no artefact"
        raise HydraEdgeError(f"{bundle} is a bundle for target {target!r} and {what}; the app runs ExecuTorch .pte "
                             "files: convert with --target android")
    files = bundle_files(bundle, manifest.artefacts)  # every file's sha256 against the manifest, one line if not
    if not lut.is_file():
        raise HydraEdgeError(f"{lut} not found; build the table with hydra-edge lut --bundle {bundle}")
    read_table(lut, bundle)  # a table for another bundle (manifest sha256) or naming other artefacts: LutError
    return Checked(files=dict(files), lut=lut, manifest_sha256=sha256_file(bundle / MANIFEST))


def keystore(path: Optional[Path]) -> Path:
    """The signing key: ``path`` if given (it must exist), else one made once in the user's config folder."""
    if path is not None:
        if not path.is_file():
            raise HydraEdgeError(f"keystore {path} not found; pass an existing keystore, or leave --keystore out "
                                 "to use the one hydra-edge keeps")
        return path
    path = config_dir() / "android-debug.keystore"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.unlink()
            _run(["keytool", "-genkeypair", "-keystore", tmp, "-storetype", "PKCS12", "-storepass", KEY_PASS,
                  "-keypass", KEY_PASS, "-alias", KEY_ALIAS, "-keyalg", "RSA", "-keysize", "2048",
                  "-validity", "10000", "-dname", "CN=hydra-edge demo"], "making the signing key (keytool)")
    return path


def build_apk(bundle: Path, lut: Path, out: Path, keystore_path: Optional[Path] = None,
              key_alias: str = KEY_ALIAS, key_pass: str = KEY_PASS, log=print) -> Dict[str, float]:
    """Check, compile, dex, package, align and sign; ``out`` appears only when whole. Returns timings (s)."""
    start = time.monotonic()
    check_tools()
    checked = check_inputs(bundle, lut)
    key = keystore(keystore_path)
    if keystore_path is None:
        key_alias, key_pass = KEY_ALIAS, KEY_PASS
    times: Dict[str, float] = {}
    parts = {name: maven_part(name) for name in MAVEN}
    et = executorch_runtime()
    core = core_jars()
    times["fetch_s"] = time.monotonic() - start
    t = time.monotonic()
    runtime_check = host_runtime.verify(bundle, read_manifest(bundle).artefacts, runtime_parts(et, parts), cache_dir(),
                                        log)
    times["runtime_check_s"] = time.monotonic() - t
    src = APP / "app" / "src" / "main"
    with tempfile.TemporaryDirectory(prefix="hydra-edge-apk-") as tmp_name:
        tmp = Path(tmp_name)
        fb = tmp / "fbjni"
        with zipfile.ZipFile(parts["fbjni"]) as aar:
            aar.extractall(fb)
        t = time.monotonic()
        gen, obj = tmp / "gen", tmp / "obj"
        gen.mkdir()
        obj.mkdir()
        _run(["aapt", "package", "-f", "-m", "-J", gen, "-M", src / "AndroidManifest.xml", "-S", src / "res",
              "-I", FRAMEWORK_RES], "aapt (R.java)")
        java = sorted(str(p) for p in [*gen.rglob("*.java"), *(src / "java").rglob("*.java")])
        classpath = os.pathsep.join(str(p) for p in [parts["android-all"], et / "android" / "libs" / "classes.jar",
                                                        fb / "classes.jar", *core])
        _run(["javac", "--release", "8", "-Xlint:-options", "-nowarn", "-encoding", "UTF-8", "-d", obj,
              "-cp", classpath, *java], "javac")
        times["compile_s"] = time.monotonic() - t
        t = time.monotonic()
        dex_inputs = [obj, et / "android" / "libs" / "classes.jar", fb / "classes.jar", parts["nativeloader"]]
        dex_inputs += shrunk_core(core, obj, tmp)
        stage = tmp / "stage"
        stage.mkdir()
        _run(["java", "-cp", parts["dx"], "com.android.dx.command.Main", "--dex", f"--min-sdk-version={MIN_SDK}",
              f"--output={stage / 'classes.dex'}", *dex_inputs], "dx (classes.dex)")
        check_dex(stage / "classes.dex")
        times["dex_s"] = time.monotonic() - t
        t = time.monotonic()
        assets = tmp / "assets"
        (assets / "bundle").mkdir(parents=True)
        for name, path in {MANIFEST: bundle / MANIFEST, **checked.files}.items():
            (assets / "bundle" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, assets / "bundle" / name)
        shutil.copyfile(lut, assets / "lut.json")
        write_json(assets / host_runtime.RECORD, runtime_check)
        libs: List[str] = []
        for abi in ABIS:
            (stage / "lib" / abi).mkdir(parents=True)
            shutil.copyfile(et / "third-party" / "android" / "libs" / "executorch" / abi / "libexecutorch.so",
                            stage / "lib" / abi / "libexecutorch.so")
            for so in ("libfbjni.so", "libc++_shared.so"):
                shutil.copyfile(fb / "jni" / abi / so, stage / "lib" / abi / so)
            libs += [f"lib/{abi}/{so}" for so in ("libexecutorch.so", "libfbjni.so", "libc++_shared.so")]
        unsigned, aligned = tmp / "unsigned.apk", tmp / "aligned.apk"
        _run(["aapt", "package", "-f", "-M", src / "AndroidManifest.xml", "-S", src / "res", "-A", assets,
              "-I", FRAMEWORK_RES, "-0", "pte", "-F", unsigned], "aapt (package)")
        _run(["aapt", "add", unsigned, "classes.dex", *libs], "aapt (classes.dex, native libraries)", cwd=stage)
        _run(["zipalign", "-f", "-p", "4", unsigned, aligned], "zipalign")
        times["package_s"] = time.monotonic() - t
        t = time.monotonic()
        with atomic_path(out) as signed:
            _run(["apksigner", "sign", "--ks", key, "--ks-pass", f"pass:{key_pass}", "--key-pass", f"pass:{key_pass}",
                  "--ks-key-alias", key_alias, "--v4-signing-enabled", "false", "--out", signed, aligned], "apksigner sign")
            _run(["apksigner", "verify", signed], "apksigner verify")
        times["sign_s"] = time.monotonic() - t
    times["total_s"] = time.monotonic() - start
    return times
