"""Getting a device ready: files pushed once and reused, and a Python that has the runtime.

Everything here goes through the ``Transport`` interface only, so ssh boards, adb phones and
this machine are prepared by the same code.
"""

from __future__ import annotations

import json
import posixpath
import secrets
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable, Mapping

from ..atomic import sha256_file
from ..errors import HydraEdgeError
from ..records.manifest import ArtefactRecord
from ..runtime.engines import impostors, lacks, pip_install, runtimes_of
from ..shipped import package_path
from ..transport import IntegrityError, RemoteCommandError, Transport
from ..transport.base import parse_sha256sum

MIN_PYTHON = (3, 9)
PIP_TIMEOUT_S = 1800  # a board compiling a wheel from source is slow, but not this slow
# Run with the device's interpreter: its version and which of the named modules it lacks.
# Unpack "$1.tar" into "$1", then move each named file into place (rename: atomic per file).
_UNPACK = ('set -e; stage=$1; shift; mkdir -p "$stage"; tar -xf "$stage.tar" -C "$stage"; '
           'for f in "$@"; do mkdir -p "$(dirname "$f")"; mv -f "$stage/$f" "$f"; done')
_PROBE = ("import importlib.util, json, sys; "
          "print(json.dumps({'version': list(sys.version_info[:2]), "
          "'missing': [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]}))")


PACKAGE = package_path("hydra_edge")
# The torch-free part of hydra_edge a device runs (the runner, the switcher, the board app),
# pushed as a package so that device code imports it exactly as the host does.
DEVICE_MODULES = ("__init__.py", "errors.py", "atomic.py", "bounds.py", "formats.py", "calibration_plan.py",
                  "runtime/*.py", "runtime/signals/*.py", "records/*.py")


def package_files(remote_root: str) -> dict[str, Path]:
    """``DEVICE_MODULES`` as ``{device path under remote_root: local file}``."""
    return {f"{remote_root}/hydra_edge/{path.relative_to(PACKAGE).as_posix()}": path
            for pattern in DEVICE_MODULES for path in sorted(PACKAGE.glob(pattern))}


def runtime_requirements(artefacts: Iterable[ArtefactRecord]) -> dict[str, str]:
    """``{import name: pip requirement}`` a device needs to run ``artefacts``: numpy, msgspec and their runtimes."""
    requirements = {"numpy": "numpy", **runtimes_of(artefacts)}
    requirements["msgspec"] = "msgspec>=0.18"  # hydra_edge.records reads the manifest and lut.json
    return requirements


class RuntimeMissingError(HydraEdgeError):
    """The device's Python lacks numpy or the bundle's runtime."""


def push_files(transport: Transport, files: Mapping[str, Path], digests: Mapping[str, str] = {}) -> int:
    """Copy ``{path under the device's base dir: local file}`` there, skipping files already intact.

    One ``sha256sum`` over every target decides what to skip, so a resumed run re-sends
    nothing. What is missing travels as one tar archive (one verified push instead of several
    round trips per file), is unpacked into a folder unique to this run and then renamed into
    place file by file, so two runs pushing to one board (two names for it in a fleet) never
    see each other's half-written files. ``digests`` holds sha256s already computed (and checked
    against the manifest) for some of ``files``; the rest are hashed here. Returns how many files were sent.
    """
    want = {rel: digests.get(rel) or sha256_file(local) for rel, local in files.items()}
    have = remote_hashes(transport, [transport.remote_path(rel) for rel in files])
    missing = [rel for rel in files if have.get(transport.remote_path(rel)) != want[rel]]
    if not missing:
        return 0
    stage = f".incoming-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="hydra-push-") as tmp:
        archive = Path(tmp) / "files.tar"
        with tarfile.open(archive, "w") as tar:
            for rel in missing:
                tar.add(files[rel], arcname=rel)
        transport.push(archive, transport.remote_path(f"{stage}.tar"))
    try:
        transport.run(["sh", "-c", _UNPACK, "sh", stage, *missing], cwd=transport.base_dir)
    finally:  # by full path: whatever failed above, no half-pushed archive stays behind
        transport.run(["rm", "-rf", "--", transport.remote_path(stage), transport.remote_path(f"{stage}.tar")],
                      check=False)
    arrived = remote_hashes(transport, [transport.remote_path(rel) for rel in missing])
    broken = [rel for rel in missing if arrived.get(transport.remote_path(rel)) != want[rel]]
    if broken:
        raise IntegrityError(f"{broken[0]} did not arrive intact on {transport.device_id}; run again to re-send it")
    return len(missing)


def remote_hashes(transport: Transport, paths: list[str]) -> dict[str, str]:
    """sha256 of those ``paths`` that exist on the device (``sha256sum`` skips the others)."""
    if not paths:
        return {}
    return parse_sha256sum(transport.run(["sha256sum", "--", *paths], check=False).stdout)


def probe(transport: Transport, python: str, modules: Iterable[str]) -> list[str]:
    """Which of ``modules`` the device's ``python`` cannot import; checks the Python itself too."""
    result = transport.run([python, "-c", _PROBE, *modules], check=False, timeout=120)
    if result.returncode in (126, 127):
        raise RuntimeMissingError(
            f"there is no Python at {python!r} on {transport.device_id}; install python3 (3.9 or newer), "
            "pass --python PATH, or for a phone pass a native --runner")
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        said = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise RuntimeMissingError(f"{python!r} on {transport.device_id} does not run as Python: {said}") from None
    if tuple(found["version"]) < MIN_PYTHON:
        raise RuntimeMissingError(
            f"{python!r} on {transport.device_id} is Python {'.'.join(map(str, found['version']))}; "
            f"the runner needs {'.'.join(map(str, MIN_PYTHON))}+ (pass --python PATH)")
    return list(found["missing"])


def device_python(given: str | None, local: bool) -> str:
    """The interpreter a device command starts: the one typed, else this one when this machine is the
    device (it has the runtimes hydra-edge was installed with), else the board's ``python3``."""
    return given or (sys.executable if local else "python3")


def ensure_python(transport: Transport, python: str, requirements: Mapping[str, str], setup: bool,
                  pip_args: tuple[str, ...] = ()) -> str:
    """The interpreter to run the runner with, able to import every module in ``requirements``.

    ``requirements`` maps an import name to its pip requirement. Without ``setup`` a missing
    module is one clear line naming the package; with it, a venv under the device's base dir
    is created once (from ``python``) and pip installs what is missing there, so later runs
    reuse it without touching pip.
    """
    if setup:
        python = _venv(transport, python)
    lookalikes = impostors(requirements)
    missing = probe(transport, python, [*requirements, *lookalikes])
    if setup and any(m in requirements for m in missing):
        _pip_install(transport, python, [requirements[m] for m in missing if m in requirements], pip_args)
        missing = probe(transport, python, [*requirements, *lookalikes])
    lacking = [m for m in missing if m in requirements]
    if lacking:
        line = lacks(requirements, lacking, [m for m in lookalikes if m not in missing], python, transport.device_id)
        how = ("pip could not provide it in the --setup venv" if setup else
               f"install with `{pip_install([requirements[m] for m in lacking], python)}` on the device, "
               "or re-run with --setup")
        raise RuntimeMissingError(f"{line}; {how}")
    return python


def _venv(transport: Transport, base_python: str) -> str:
    """The device's calibration venv (created once from ``base_python``), as its python path."""
    venv = transport.remote_path("venv")
    python = posixpath.join(venv, "bin", "python")
    if transport.exists(python):
        if transport.run([python, "-m", "pip", "--version"], check=False, timeout=120).ok:
            return python
        transport.run(["rm", "-rf", venv], check=False)  # an interrupted creation left it without pip: redo
    probe(transport, base_python, [])  # a clear line if there is no usable Python at all
    try:
        transport.run([base_python, "-m", "venv", venv], timeout=600)
    except RemoteCommandError as e:
        transport.run(["rm", "-rf", venv], check=False)
        raise RuntimeMissingError(f"cannot create a venv with {base_python!r} on {transport.device_id} "
                                  f"({e.result.stderr.strip().splitlines()[-1] if e.result.stderr.strip() else 'no error text'}); "
                                  "install the venv module (Debian: apt-get install python3-venv)") from None
    return python


def _pip_install(transport: Transport, python: str, packages: list[str], pip_args: tuple[str, ...]) -> None:
    argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *pip_args, *packages]
    result = transport.run(argv, check=False, timeout=PIP_TIMEOUT_S)
    if result.returncode != 0:
        lines = [line for line in (result.stderr + result.stdout).splitlines() if line.strip()]
        said = next((line for line in reversed(lines) if "ERROR" in line), lines[-1] if lines else "no output")
        raise RuntimeMissingError(f"pip could not install {' '.join(packages)} on {transport.device_id}: "
                                  f"{said.strip()}")
