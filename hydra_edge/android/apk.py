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
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..atomic import atomic_path, sha256_file, write_json
from ..errors import HydraEdgeError
from ..records.lut import LutError
from ..records.manifest import MANIFEST, bundle_files, read_manifest
from . import dex, host_runtime

APP = Path(__file__).resolve().parents[2] / "apps" / "android-demo"
PACKAGE = "org.hydraedge.demo"
VERSION_CODE, VERSION_NAME = 1, "0.1.0"
# minSdk 26: the first release whose dex format dx's output targets. targetSdk 34, as app/build.gradle's:
# aapt links against API 29's framework-res and javac against API 30's classes,
# but the target is only the behaviour the phone applies, and the app uses none that changed up to 34 (no
# permissions, services or PendingIntents; its one broadcast, the sticky battery one, is a protected system
# broadcast, exempt from 34's receiver flags; resources.arsc is stored uncompressed and aligned, as 30 requires).
# The source manifest names none of these (the Android Gradle plugin refuses <uses-sdk> and ignores package=);
# ``app_manifest`` writes them into the copy aapt reads, and app/build.gradle declares the same.
MIN_SDK, TARGET_SDK = 26, 34
ANDROID_NS = "http://schemas.android.com/apk/res/android"
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


def _run(argv: Sequence[str | Path], what: str, cwd: Optional[Path] = None,
         env: Optional[Dict[str, str]] = None) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        tail = next((line for line in reversed(said) if "ERROR" in line or "error" in line), said[-1] if said else "")
        raise HydraEdgeError(f"{what} failed (exit {done.returncode}): {tail.strip()[:300]}")
    return done.stdout


def app_manifest(src: Path, dest: Path) -> Path:
    """The app's manifest as aapt needs it: the source's (shared with the Gradle build, which takes these from
    build.gradle) with the package, version, ``<uses-sdk>`` and native-library extraction written in. aapt
    refuses a manifest with no package (``--rename-manifest-package`` too needs one to rename); the libraries
    are added compressed (``aapt add``), so the phone must extract them at install."""
    ET.register_namespace("android", ANDROID_NS)
    try:
        tree = ET.parse(src)
    except (OSError, ET.ParseError) as e:
        raise HydraEdgeError(f"{src} cannot be read as XML ({e}); restore it from the hydra-edge checkout") from None
    root = tree.getroot()
    root.set("package", PACKAGE)
    root.set(f"{{{ANDROID_NS}}}versionCode", str(VERSION_CODE))
    root.set(f"{{{ANDROID_NS}}}versionName", VERSION_NAME)
    sdk = ET.Element("uses-sdk", {f"{{{ANDROID_NS}}}minSdkVersion": str(MIN_SDK),
                                  f"{{{ANDROID_NS}}}targetSdkVersion": str(TARGET_SDK)})
    sdk.tail = root.text
    root.insert(0, sdk)
    application = root.find("application")
    if application is None:
        raise HydraEdgeError(f"{src} has no <application>; restore it from the hydra-edge checkout")
    application.set(f"{{{ANDROID_NS}}}extractNativeLibs", "true")
    tree.write(dest, encoding="utf-8", xml_declaration=True)
    return dest


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
    from ..runtime.lut import read_table, thermal_source_problem

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
    table = read_table(lut, bundle)  # a table for another bundle, target or artefacts: LutError
    problem = thermal_source_problem(table.thermal_source, "android", "the app (PowerManager's thermal status)")
    if problem:  # the app passes the status to the table whatever its source: no other table may go in
        raise LutError(f"{lut}: $.thermal.source: {problem}")
    return Checked(files=dict(files), lut=lut, manifest_sha256=sha256_file(bundle / MANIFEST))


class SigningError(HydraEdgeError):
    """The signing key cannot sign: its keystore, alias or a password is wrong; said before anything is built."""


KS_PASS_ENV, KEY_PASS_ENV = "HYDRA_EDGE_KS_PASS", "HYDRA_EDGE_KEY_PASS"  # how keytool and apksigner get them
# minSdk 26 phones all verify v2 (Android 7.0+); v3 (Android 9+) carries key rotation; v1 (JAR signing) only
# serves Android < 7.0, which cannot install the app anyway; v4 is a separate .idsig file for incremental installs.
SCHEMES = ("--v1-signing-enabled", "false", "--v2-signing-enabled", "true", "--v3-signing-enabled", "true",
           "--v4-signing-enabled", "false")


@dataclass(frozen=True)
class SigningKey:
    """A keystore, the alias of the key in it, and both passwords. The passwords reach keytool and apksigner
    through their environment (``-storepass:env``, ``env:``), never their command line, and are never shown."""
    store: Path
    alias: str
    store_pass: str = field(repr=False)
    key_pass: str = field(repr=False)

    def env(self) -> Dict[str, str]:
        return {**os.environ, KS_PASS_ENV: self.store_pass, KEY_PASS_ENV: self.key_pass}

    def signer_args(self) -> List[str]:
        """apksigner's arguments for this key and the schemes the APK carries: the same for the check and the build."""
        return ["--ks", str(self.store), "--ks-key-alias", self.alias, "--ks-pass", f"env:{KS_PASS_ENV}",
                "--key-pass", f"env:{KEY_PASS_ENV}", *SCHEMES]


def password(spec: str, option: str) -> str:
    """A password given as apksigner takes one: ``pass:PASSWORD``, ``env:NAME`` (a variable of this process) or
    ``file:PATH`` (its first line). Env and file keep it off every command line and out of shell history."""
    kind, colon, value = spec.partition(":")
    if not colon or kind not in ("pass", "env", "file"):
        raise SigningError(f"{option} takes env:NAME, file:PATH or pass:PASSWORD, as apksigner does "
                           f"(e.g. {option} env:RELEASE_PASS, with RELEASE_PASS exported)")
    if kind == "env":
        found = os.environ.get(value, "")
        if not found:
            raise SigningError(f"{option} env:{value}: {value} is not set or empty; export it, "
                               f"or use {option} file:PATH")
        return found
    if kind == "file":
        try:
            found = Path(value).read_text(encoding="utf-8").split("\n", 1)[0].rstrip("\r")
        except (OSError, UnicodeDecodeError) as e:
            why = f"{e.__class__.__name__}: {getattr(e, 'strerror', None) or e}"
            raise SigningError(f"{option} file:{value}: cannot read it ({why}); give a file whose first line "
                               "is the password") from None
        if not found:
            raise SigningError(f"{option} file:{value}: its first line is empty; put the password on it")
        return found
    if not value:
        raise SigningError(f"{option} pass: is empty; give the password (env:NAME or file:PATH keep it off "
                           "the command line)")
    return value


def debug_key() -> SigningKey:
    """The key hydra-edge signs with when given none: made once by keytool in the user's config folder. Its
    password is public (it is a debug key: a phone accepts it, a store does not)."""
    path = config_dir() / "android-debug.keystore"
    key = SigningKey(path, KEY_ALIAS, KEY_PASS, KEY_PASS)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.unlink()
            _run(["keytool", "-genkeypair", "-keystore", tmp, "-storetype", "PKCS12", "-storepass:env", KS_PASS_ENV,
                  "-alias", KEY_ALIAS, "-keyalg", "RSA", "-keysize", "2048", "-validity", "10000",
                  "-dname", "CN=hydra-edge demo"], "making the signing key (keytool)", env=key.env())
    return key


def check_key(key: SigningKey) -> None:
    """Prove ``key`` signs before anything is built, each fault one line: the keystore (keytool reads it with
    the store password), the alias (keytool: there, and a private key), then the key password, by apksigner
    signing a one-entry zip with exactly the arguments the build will use."""
    where = f"keystore {key.store}"
    if not key.store.is_file():
        raise SigningError(f"{where} not found; give an existing keystore (docs/android.md: making a release key), "
                           "or leave --keystore out to sign with hydra-edge's debug key")
    listed = subprocess.run(["keytool", "-list", "-v", "-keystore", str(key.store), "-storepass:env", KS_PASS_ENV,
                             "-alias", key.alias], capture_output=True, text=True, env=key.env(), check=False)
    said = (listed.stdout + listed.stderr).strip()
    if listed.returncode != 0:
        if "password was incorrect" in said:
            raise SigningError(f"{where}: the store password (--ks-pass) is wrong; give the one the keystore was "
                               "made with")
        if "does not exist" in said:
            raise SigningError(f"{where} has no alias {key.alias!r}; give --key-alias one of "
                               f"{', '.join(_aliases(key)) or 'its aliases'} (keytool -list -keystore {key.store})")
        error = next((line for line in said.splitlines() if "error" in line), said.splitlines()[-1] if said else "")
        raise SigningError(f"{where} cannot be read by keytool ({error.strip()[:200]}); give a JKS or PKCS12 keystore")
    entry = next((line.split(":", 1)[1].strip() for line in said.splitlines() if line.startswith("Entry type:")), "?")
    if entry != "PrivateKeyEntry":
        raise SigningError(f"{where}: alias {key.alias!r} holds a {entry}, not a private key; give --key-alias the "
                           "alias of a key (keytool -genkeypair makes one)")
    with tempfile.TemporaryDirectory(prefix="hydra-edge-sign-") as tmp:
        probe = Path(tmp) / "probe.apk"
        with zipfile.ZipFile(probe, "w") as z:
            z.writestr("probe", b"")
        signed = subprocess.run(["apksigner", "sign", *key.signer_args(), "--min-sdk-version", str(MIN_SDK),
                                 "--out", str(Path(tmp) / "signed.apk"), str(probe)],
                                capture_output=True, text=True, env=key.env(), check=False)
    if signed.returncode != 0:
        said = (signed.stderr.strip() or signed.stdout.strip()).splitlines()
        if any("Wrong password?" in line for line in said):
            raise SigningError(f"{where}: the password of key {key.alias!r} is wrong (--key-pass; without it, the "
                               "store password is tried); give the key's own password")
        raise SigningError(f"{where}: apksigner cannot sign with alias {key.alias!r}: "
                           f"{(said[0] if said else 'no output').strip()[:200]}")


def _aliases(key: SigningKey) -> List[str]:
    """The aliases in ``key``'s keystore (read with its store password, which was right), to name in an error."""
    listed = subprocess.run(["keytool", "-list", "-keystore", str(key.store), "-storepass:env", KS_PASS_ENV],
                            capture_output=True, text=True, env=key.env(), check=False)
    return [line.split(",", 1)[0] for line in listed.stdout.splitlines() if ", " in line and "Entry" in line]


def build_apk(bundle: Path, lut: Path, out: Path, key: Optional[SigningKey] = None, log=print) -> Dict[str, float]:
    """Check (the signing key included), compile, dex, package, align and sign; ``out`` appears only when whole.
    ``key``: None signs with hydra-edge's debug key. Returns timings (s)."""
    start = time.monotonic()
    check_tools()
    key = key or debug_key()
    check_key(key)
    checked = check_inputs(bundle, lut)
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
        manifest = app_manifest(src / "AndroidManifest.xml", tmp / "AndroidManifest.xml")
        _run(["aapt", "package", "-f", "-m", "-J", gen, "-M", manifest, "-S", src / "res",
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
        _run(["aapt", "package", "-f", "-M", manifest, "-S", src / "res", "-A", assets,
              "-I", FRAMEWORK_RES, "-0", "pte", "-F", unsigned], "aapt (package)")
        _run(["aapt", "add", unsigned, "classes.dex", *libs], "aapt (classes.dex, native libraries)", cwd=stage)
        _run(["zipalign", "-f", "-p", "4", unsigned, aligned], "zipalign")
        times["package_s"] = time.monotonic() - t
        t = time.monotonic()
        with atomic_path(out) as signed:
            _run(["apksigner", "sign", *key.signer_args(), "--out", signed, aligned], "apksigner sign", env=key.env())
            _run(["apksigner", "verify", signed], "apksigner verify")
        times["sign_s"] = time.monotonic() - t
    times["total_s"] = time.monotonic() - start
    return times
