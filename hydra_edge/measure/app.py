"""The Android demo app as the phone's side: its APK installed and checked, its bench mode run.

A phone without Python or a hand-built ``executor_runner`` still runs the demo app, which carries
its bundle, its table and the ExecuTorch runtime. ``deploy --apk`` installs it (``adb install -r`` of
the exact bytes whose sha256 was taken, then the installed ``base.apk`` hashed on the phone, as every
pushed file is checked) and starts it. ``calibrate --runner app`` starts its bench mode with the
calibration's settings; the app writes ``calibration/runner.py``'s JSON lines to a file in its
external files folder (its stdout is not the shell's), which the host follows with ``cat`` over adb
and hands to the same parser the Python runner's output goes through (``Session._on_line``), so the
record has the same schema and ``lut`` reads it. Every command goes through ``Transport.run``, so
each remote argument is quoted.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
import zipfile
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ..android.apk import PACKAGE
from ..atomic import sha256_file
from ..errors import HydraEdgeError
from ..formats import FORMATS
from ..records.manifest import ArtefactRecord
from ..transport import AdbTransport, Transport, TransportError, TransportTimeout
from ..transport.adb import InstallRefusedError

ACTIVITY = f"{PACKAGE}/.MainActivity"  # the app's one Activity, as ``am start -n`` names it
# getExternalFilesDir(null)/Bench.FILE: the one place the app writes that the adb shell user can read
BENCH_FILE = f"/sdcard/Android/data/{PACKAGE}/files/bench.jsonl"
APP_FORMAT = "executorch"  # the app runs ExecuTorch programs (.pte) only
APP_IDLE_S = 600.0  # the app writes a line per artefact; this long without one is a hung or killed app
POLL_S = 0.5
# While no line comes, whether the app's process is still there is asked this often; it is dead when two asks
# in a row find none (the first ask may come before a just-started process is listed), so a crash is one line
# within about twice this, not at APP_IDLE_S.
ALIVE_CHECK_S = 2.0
DEPLOY_HINT = "build it with hydra-edge android-app --bundle B --lut L --out demo.apk"

# What ``pm install`` refusals mean for this app, and the one thing to do about each.
INSTALL_HINTS = {
    "INSTALL_FAILED_UPDATE_INCOMPATIBLE": f"an {PACKAGE} signed with another key is installed; remove it "
                                          "(`adb{flags} uninstall " + PACKAGE + "`, its data goes too) and deploy again",
    "INSTALL_PARSE_FAILED_INCONSISTENT_CERTIFICATES": "an app of the same package signed with another key is "
                                                      "installed; uninstall it and deploy again",
    "INSTALL_FAILED_VERSION_DOWNGRADE": f"a newer {PACKAGE} is installed; uninstall it and deploy again",
    "INSTALL_FAILED_INSUFFICIENT_STORAGE": "free some storage on the phone and deploy again",
    "INSTALL_FAILED_OLDER_SDK": "the phone's Android is older than the app needs (8.0, API 26)",
    "INSTALL_FAILED_NO_MATCHING_ABIS": "the app carries ExecuTorch for arm64-v8a and x86_64 only",
    "INSTALL_FAILED_USER_RESTRICTED": "the phone refused installs over USB; allow them (Developer options) "
                                      "or accept the prompt on the phone",
    "INSTALL_PARSE_FAILED_NO_CERTIFICATES": f"the APK is not signed; {DEPLOY_HINT}",
    "INSTALL_PARSE_FAILED_NOT_APK": f"the file is not an APK; {DEPLOY_HINT}",
}


class AppError(HydraEdgeError):
    """The demo app cannot be installed, started or run as asked; the message says what to do."""


class AppDied(AppError):
    """The app's process is gone while the host waits for its next bench line: it crashed or was killed."""


def _serial_flags(transport: Transport) -> str:
    """``-s SERIAL`` (and ``-P PORT``) as a user would type them in a suggested adb command."""
    if not isinstance(transport, AdbTransport):
        return ""
    return (f" -P {transport.adb_port}" if transport.adb_port else "") + (f" -s {transport.serial}" if transport.serial else "")


def _deploy_line(transport: Transport) -> str:
    serial = transport.serial if isinstance(transport, AdbTransport) and transport.serial else "SERIAL"
    return f"hydra-edge deploy --serial {serial} --apk demo.apk"


def require_adb(transport: Transport) -> AdbTransport:
    """The app lives on an Android phone: anything but an adb transport is one line."""
    if not isinstance(transport, AdbTransport):
        raise AppError(f"--runner app runs the demo app on an Android phone; {transport.device_id} is not one "
                       "(name the phone with --serial)")
    return transport


def check_formats(artefacts: Iterable[ArtefactRecord]) -> None:
    """The app runs .pte artefacts only: a bundle of another format is one line before the phone is asked."""
    others = sorted({a.format for a in artefacts if a.format != APP_FORMAT})
    if others:
        raise AppError(f"the demo app runs {FORMATS[APP_FORMAT].suffix} artefacts ({APP_FORMAT}); this bundle "
                       f"holds {', '.join(others)}: calibrate a bundle converted with --target android, or use "
                       "the Python runner or a native --runner")


# --- the APK ------------------------------------------------------------------------------------


def check_apk(apk: Path) -> None:
    """The demo app's APK: a zip with an Android manifest and the bundle the app carries. Anything else
    is one line before the phone is touched."""
    try:
        with zipfile.ZipFile(apk) as z:
            names = set(z.namelist())
    except (zipfile.BadZipFile, OSError) as e:
        raise AppError(f"{apk} is not an APK ({e}); {DEPLOY_HINT}") from None
    if "AndroidManifest.xml" not in names or "assets/bundle/manifest.json" not in names:
        raise AppError(f"{apk} is not the hydra-edge demo app (it carries no bundle); {DEPLOY_HINT}")


def installed_apk(transport: Transport) -> str | None:
    """Where the phone keeps the app's base.apk (``pm path``), or None when it is not installed."""
    result = transport.run(["pm", "path", PACKAGE], check=False, timeout=60)
    paths = [line.removeprefix("package:").strip() for line in result.stdout.splitlines()
             if line.startswith("package:")]
    return next((p for p in paths if p.endswith("/base.apk")), paths[0] if paths else None)


def install(transport: Transport, apk: Path) -> str:
    """Install ``apk`` (``check_apk`` passed it) with ``adb install -r`` and prove the phone holds exactly it;
    returns its sha256.

    A private copy is hashed and installed (so the bytes hashed are the bytes sent, whatever happens
    to ``apk`` meanwhile); afterwards the installed ``base.apk`` is hashed on the phone. An APK of
    another package installs beside the app, so a missing or different ``base.apk`` is that, in one line.
    """
    adb = require_adb(transport)
    with tempfile.TemporaryDirectory(prefix="hydra-apk-") as tmp:
        # adb installs only a file named *.apk
        copy = Path(tmp) / (apk.name if apk.name.lower().endswith(".apk") else apk.name + ".apk")
        shutil.copyfile(apk, copy)
        digest = sha256_file(copy)
        try:
            adb.install(copy)
        except InstallRefusedError as e:
            hint = INSTALL_HINTS.get(e.code, "").format(flags=_serial_flags(transport))
            raise AppError(f"{transport.device_id} refused to install {apk.name}: {e.reason}"
                           + (f"; {hint}" if hint else "")) from None
    where = installed_apk(transport)
    if where is None:
        raise AppError(f"{apk.name} installed on {transport.device_id}, but not as {PACKAGE}: it is another "
                       f"app's package, not the hydra-edge demo app; {DEPLOY_HINT}")
    got = transport.sha256(where)
    if got != digest:
        raise AppError(f"{PACKAGE} on {transport.device_id} is not {apk.name} (sha256 {got[:12]}... there, "
                       f"{digest[:12]}... here): the APK is another app's package, or the install was "
                       f"replaced; {DEPLOY_HINT} and deploy again")
    return digest


# --- starting and following the app -------------------------------------------------------------


def bench_argv(runs: int, warmup: int, threads: int, only: Sequence[str], plan: Mapping[str, Any]) -> list[str]:
    """``am start`` of bench mode with the settings the Python runner gets (threads 0: each artefact's
    own; ``only``: these artefact ids, as the runner's ``--only``; ``plan``: the rounds' settings, as JSON).
    ``-S`` stops a running app first, so its ``onCreate`` reads these extras. ``--esa`` splits its value at
    commas, so one in an id is escaped."""
    ids = ",".join(artefact.replace(",", "\\,") for artefact in only)
    return ["am", "start", "-S", "-n", ACTIVITY, "--es", "mode", "bench", "--ei", "runs", str(runs),
            "--ei", "warmup", str(warmup), "--ei", "threads", str(threads), "--esa", "only", ids,
            "--es", "plan", json.dumps(dict(plan), separators=(",", ":"))]


def start(transport: Transport, argv: Sequence[str]) -> None:
    """Run ``am start``; an app that is not installed, or any refusal, is one line.

    ``am`` reports a missing Activity on its stderr with ``Error`` lines (and, on older Androids, exit 0),
    so its words count as much as its status.
    """
    result = transport.run(list(argv), check=False, timeout=60)
    said = [line.strip() for line in (result.stdout + "\n" + result.stderr).splitlines()
            if line.strip().startswith("Error")]
    if result.returncode == 0 and not said:
        return
    if any("does not exist" in line or "unable to resolve" in line for line in said):
        raise AppError(f"the demo app ({PACKAGE}) is not installed on {transport.device_id}; install it with "
                       f"{_deploy_line(transport)} (an APK from hydra-edge android-app)")
    last = said[-1] if said else (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
    raise AppError(f"`am start` of {ACTIVITY} failed on {transport.device_id} (exit {result.returncode}): {last}")


def stop(transport: Transport) -> None:
    """Best effort: the app stops timing (after a timeout, a fatal line or Ctrl-C); the first error is what counts."""
    try:
        transport.run(["am", "force-stop", PACKAGE], check=False, timeout=30)
    except TransportError:
        pass


def running(transport: Transport) -> bool:
    """Whether the app has a process on the phone. ``pidof`` (toybox, Android 7+) exits 1, printing
    nothing, when there is none; any other failure (no pidof, a shell error) cannot tell, and counts as
    running, so the idle timeout still decides."""
    result = transport.run(["pidof", PACKAGE], check=False, timeout=30)
    return not (result.returncode == 1 and not result.stdout.strip())


def logcat_hint(transport: Transport) -> str:
    """The adb command that shows the app's own lines and a crash's stack trace."""
    return f"`adb{_serial_flags(transport)} logcat -d -s hydra-edge AndroidRuntime:E`"


def follow(transport: Transport, path: str, idle_s: float, poll_s: float = POLL_S,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Iterator[str]:
    """Each complete line of the device file ``path`` once, as the app writes it; runs until the caller stops.

    The file is read whole with ``cat`` each ``poll_s`` (it is a few kB); text after its last newline
    is a line still being written and waits for the next read. While no line comes, every
    ``ALIVE_CHECK_S`` the app's process is looked for; none twice in a row raises ``AppDied`` (after the
    lines it wrote before dying). No new line for ``idle_s`` (a file never created included) raises
    ``TransportTimeout``.
    """
    seen, last_new, last_check, missing = 0, clock(), clock(), 0
    while True:
        result = transport.run(["cat", path], check=False, timeout=60)
        lines = result.stdout.split("\n")[:-1] if result.ok else []
        if len(lines) > seen:
            yield from lines[seen:]
            seen, last_new, missing = len(lines), clock(), 0
        elif clock() - last_new > idle_s:
            raise TransportTimeout(f"the app wrote no line to {path} for {idle_s:g} s (hung, or stopped: see "
                                   f"{logcat_hint(transport)}); stopped it")
        elif clock() - last_check >= ALIVE_CHECK_S:
            last_check = clock()
            missing = 0 if running(transport) else missing + 1
            if missing >= 2:
                result = transport.run(["cat", path], check=False, timeout=60)  # what it wrote before it went
                yield from (result.stdout.split("\n")[:-1] if result.ok else [])[seen:]
                raise AppDied(f"{PACKAGE} is no longer running on {transport.device_id}")
        sleep(poll_s)


def bench_lines(transport: Transport, runs: int, warmup: int, threads: int, only: Sequence[str],
                plan: Mapping[str, Any], idle_s: float) -> Iterator[str]:
    """The app's bench lines for the artefacts ``only`` names, from a fresh start: the file an earlier run
    left (its ``done`` included) is removed first, so every line read is this run's."""
    require_adb(transport)
    transport.run(["rm", "-f", BENCH_FILE], check=False, timeout=60)
    start(transport, bench_argv(runs, warmup, threads, only, plan))
    yield from follow(transport, BENCH_FILE, idle_s)


def foreign_result(line: str, artefacts: Sequence[ArtefactRecord]) -> str | None:
    """Why a ``result`` line is not about this bundle's artefacts (the APK carries another bundle), else None."""
    try:
        event = json.loads(line) if line.startswith("{") else None
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("event") != "result":
        return None
    known = {a.id: a for a in artefacts}
    artefact = known.get(str(event.get("artefact")))
    if artefact is None:
        return f"it timed {event.get('artefact')!r}, which this bundle does not hold"
    if event.get("sha256") != artefact.sha256:
        return (f"its {artefact.id} has sha256 {str(event.get('sha256'))[:12]}..., this bundle's "
                f"{artefact.sha256[:12]}...")
    return None
