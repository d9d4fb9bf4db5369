"""``hydra-edge deploy``: put the board demo app, a bundle and its lookup table on a board and start it.

Uses the calibrator's transport and device preparation (sha256-checked pushes that skip what is
already there, the same venv ``--setup`` makes), so a board that was calibrated is ready at once.
The device gets the torch-free ``hydra_edge`` package, ``app.py``, the artefacts and ``lut.json``.
``--serve PORT`` has the app serve its live page on the board's loopback, and forwards it to this
machine's (``Transport.forward``: ssh -L over the same checked connection settings) while the app runs.

The board keeps what it learns between runs: the latency loop's correction (``lut.correction.json``
beside the table), which caps the head count for up to ``LoopSettings.expire_s`` after it was saved.
``--fresh`` removes it before the app starts; ``deploy --local`` says at its start where this machine's
board folder is, what it holds and how to clear it (``local_state``).

A phone gets the Android demo app instead (``--serial S --apk demo.apk``): the APK carries its bundle and
table, so it is installed (``adb install -r``, checked by sha256 on the phone) and started (``measure.app``).
"""

from __future__ import annotations

import os
import posixpath
import shlex
import time
from contextlib import nullcontext
from pathlib import Path

import click

from ..bounds import MAX_CAMERA, MAX_IMAGES
from ..errors import HydraEdgeError
from ..measure.device import device_python, ensure_python, package_files, push_files, runtime_requirements
from ..records import correction
from ..records.manifest import MANIFEST, bundle_files, read_manifest
from ..runtime.closed_loop import correction_path
from ..runtime.latency_governor import LoopSettings
from ..runtime.live_page import URL_LINE
from ..runtime.lut import read_table
from ..runtime.preprocess import IMAGE_SUFFIXES
from ..runtime.terminal import shown
from ..shipped import shipped
from ..transport import DeviceArg, LocalTransport, Transport
from ..transport.base import LOOPBACK, host_watch
from .base import Number, command

APP = shipped("board-demo", "app.py")
APP_DIR = "app"  # under the device's hydra-edge dir
PORT = Number(1, 65535, integer=True)


def page_line(transport: Transport, local_port: int, board_port: int) -> str:
    """The live page as a browser on this machine opens it: the forward's local end (the board's own
    port when the board is this machine)."""
    url = f"{URL_LINE}http://{LOOPBACK}:{local_port}/"
    if isinstance(transport, LocalTransport):
        return url
    return f"{url} (open it in a browser here; {transport.device_id}'s port {board_port}, forwarded while the app runs)"


def payload(bundle: Path, lut: Path, images: Path | None,
            digests: dict[str, str] | None = None) -> dict[str, str | Path]:
    """``{path under the device's hydra-edge dir: local file}`` for the app and what it runs;
    ``digests`` receives the sha256 of the bundle files, checked against the manifest here."""
    if not APP.is_file():
        raise HydraEdgeError(f"the board app {APP} is missing from this installation; reinstall from the source tree")
    read_table(lut, bundle)  # a table for another bundle is refused here, not on the board
    manifest = read_manifest(bundle)
    files: dict[str, Path] = {f"{APP_DIR}/app.py": APP, **package_files(APP_DIR)}
    files[f"{APP_DIR}/bundle/{MANIFEST}"] = bundle / MANIFEST
    files[f"{APP_DIR}/bundle/lut.json"] = lut
    checked: dict[str, str] = {}
    files.update({f"{APP_DIR}/bundle/{name}": path for name, path in
                  bundle_files(bundle, manifest.artefacts, golden=False, digests=checked).items()})
    if digests is not None:
        digests.update({f"{APP_DIR}/bundle/{name}": sha for name, sha in checked.items()})
    if images is not None:
        found = [f for f in sorted(images.rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES]
        if not found:
            raise HydraEdgeError(f"no images under {images}; give a folder of images (a sub-folder per class)")
        files.update({f"{APP_DIR}/images/{f.relative_to(images).as_posix()}": f for f in found})
    return files


def deploy_to(transport: Transport, bundle: Path, lut: Path, images: Path | None, camera: int | None,
              python: str, setup: bool, pip_args: tuple[str, ...], app_args: list[str], detach: bool,
              page: str | None = None, fresh: bool = False, kept: str | None = None) -> int:
    """Push, prepare the device's Python, start the app; returns its exit code (0 when detached).

    ``page``: what to show for the app's line naming its live page (the board's own address), as soon
    as the page serves: the URL that opens it from this machine. ``fresh``: remove the latency
    correction an earlier run saved on the board, so the app starts from the table alone. ``kept``: what
    the board keeps between runs (``local_state``), said once what is to be sent has passed its checks.
    """
    digests: dict[str, str] = {}
    files = payload(bundle, lut, images, digests)
    if kept is not None:
        click.echo(kept, err=True)
    sent = push_files(transport, files, digests)
    click.echo(f"{transport.device_id}: {sent} of {len(files)} files sent (the rest were already there)", err=True)
    requirements = {**runtime_requirements(read_manifest(bundle).artefacts), "PIL": "pillow"}
    python = ensure_python(transport, python, requirements, setup, pip_args)
    root = transport.remote_path(APP_DIR)
    if fresh:
        transport.run(["rm", "-f", posixpath.join(root, "bundle", correction_path(Path("lut.json")).name)])
    source = ["--images", posixpath.join(root, "images")] if images is not None else ["--camera", str(camera)]
    argv = [python, posixpath.join(root, "app.py"), "--bundle", posixpath.join(root, "bundle"), *source, *app_args]
    env = {"PYTHONPATH": root}
    if detach:  # started in the background with its output to a log: it runs on after we go
        log = posixpath.join(root, "app.log")
        line = f"nohup {shlex.join(argv)} > {shlex.quote(log)} 2>&1 &"
        transport.run(["sh", "-c", line], env=env)
        click.echo(f"started on {transport.device_id}; its output goes to {log}")
        return 0
    # stderr joins stdout on the device, so the app's warnings (a skipped image, a failing sensor)
    # reach the user as they happen, in order with its output; the app is stopped when we go
    merged = ["sh", "-c", host_watch("<&3 3<&- 2>&1"), "sh", *argv]
    last = error = ""
    with transport.stream(merged, env=env, check=False) as lines:
        for line in map(shown, lines):  # the board's text, never its terminal commands (click strips colours only)
            if page is not None and line.startswith(URL_LINE):
                line = page
            click.echo(line)
            last = line.strip() or last
            error = line.removeprefix("Error: ").strip() if line.startswith("Error: ") else error  # its log follows
    if lines.returncode:
        raise HydraEdgeError(f"the app on {transport.device_id} stopped with exit {lines.returncode}: "
                             f"{error or last or 'no error text'}")
    return 0


def check_phone_args(apk: Path, serial: str | None) -> None:
    """What a phone's deploy needs, checked before adb is asked anything: a phone named (``--apk`` goes over adb
    only, so the error names ``--serial``, never the ssh hosts or ``--local`` other commands take) and an APK that
    is the demo app (a wrong file is one line now, not after a phone has answered)."""
    from ..measure import app

    if serial is None and not os.environ.get("ANDROID_SERIAL"):
        raise click.UsageError("--apk installs the app on a phone over adb: name it with --serial SERIAL "
                               "(`adb devices` lists them) or set ANDROID_SERIAL")
    app.check_apk(apk)


def deploy_phone(apk: Path, serial: str | None, adb_port: int | None) -> None:
    """Install the demo APK on the phone (its sha256 checked there) and start the app; each failure one line."""
    from ..measure import app

    options = {"adb_port": adb_port} if adb_port is not None else {}
    with DeviceArg("serial", serial).open(options) as transport:
        digest = app.install(transport, apk)
        click.echo(f"{transport.device_id}: installed {apk.name} (sha256 {digest[:12]}..., checked on the phone)",
                   err=True)
        app.start(transport, ["am", "start", "-n", app.ACTIVITY])
        click.echo(f"started {app.ACTIVITY} on {transport.device_id}")


def local_board_dir() -> Path:
    """Where ``deploy --local`` keeps the board's files: a folder that outlives the command (a detached
    app runs from it and writes its log there), under the user's data folder."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "hydra-edge" / "local-board"


def local_state(folder: Path, fresh: bool) -> str:
    """What ``deploy --local`` keeps between runs, said as it starts: the folder, its size, and the latency
    correction an earlier run saved there (how old, what it does to this start), with how to clear each."""
    files = [f for f in folder.rglob("*") if f.is_file() and not f.is_symlink()] if folder.is_dir() else []
    if not files:
        return f"local board: its files go to {folder}, kept between runs (rm -r it to remove them)"
    size = sum(_size(f) for f in files)
    held = f"local board: {folder} holds {size / 1e6:.1f} MB kept between runs (the app, the bundle, the images)"
    saved = correction_path(folder / APP_DIR / "bundle" / "lut.json")
    if not saved.is_file():
        return f"{held}; rm -r it to remove them"
    if fresh:
        return f"{held}; --fresh: the latency correction {saved} is removed, the app starts from the table"
    try:
        age = f"saved {time.time() - correction.read(saved).saved_at:.0f} s ago"
    except correction.CorrectionError:
        age = "unreadable (the app will say why and not use it)"
    return (f"{held}, and the latency correction {saved}, {age}: for {LoopSettings().expire_s:.0f} s after it "
            "was saved it caps the head count the app starts with; --fresh removes it, rm -r the folder "
            "removes everything")


def _size(file: Path) -> int:
    """``file``'s size; 0 once it is gone: a detached app from an earlier deploy may still run from the folder,
    rotating app.log and renaming its correction as it saves it, between the listing and this."""
    try:
        return file.stat().st_size
    except OSError:
        return 0


@command(kept=lambda params: "the app deploy started was stopped; the files already on the board stay there and "
                            "are not sent again")
@click.option("--bundle", "-b", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="The bundle (required for a board; a phone's --apk carries its own).")
@click.option("--lut", "-l", "lut_path", type=click.Path(exists=True, path_type=Path),
              help="lut.json, or the folder hydra-edge lut wrote (required for a board).")
@click.option("--apk", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="A phone instead: install this demo app (hydra-edge android-app, with its bundle and table inside) "
                   "on --serial and start it.")
@click.option("--serial", default=None, help="The phone's adb serial, with --apk (ANDROID_SERIAL is honoured).")
@click.option("--adb-port", default=None, type=PORT, help="Port of the adb server, with --apk.")
@click.option("--host", default=None, help="The board: user@host[:port] or an ssh config alias.")
@click.option("--local", is_flag=True, help="This machine is the board.")
@click.option("--images", type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Images to push and classify (a sub-folder per class shows live accuracy).")
@click.option("--camera", type=Number(0, MAX_CAMERA, integer=True), default=None,
              help="Classify this OpenCV camera on the board instead.")
@click.option("--max-images", type=Number(1, MAX_IMAGES, integer=True), default=None,
              help="Stop after this many images (default: run on).")
@click.option("--python", default=None, help="The board's Python interpreter (default: python3; with --local, "
                                              "the one running hydra-edge, as calibrate --local uses).")
@click.option("--setup", is_flag=True, help="Create a venv on the board and pip install what it lacks (reused).")
@click.option("--pip-arg", "pip_args", multiple=True, help="Extra argument for pip on the board.")
@click.option("--detach", is_flag=True, help="Leave the app running on the board (output in app.log there).")
@click.option("--fresh", is_flag=True, help="Remove the latency correction an earlier run saved on the board "
                                            "(lut.correction.json), so the app starts from the table alone.")
@click.option("--serve", "serve_port", type=PORT, default=None,
              help="Serve the app's live page on the board's 127.0.0.1:PORT and forward it to this machine while the "
                   "app runs (over ssh; --local: opened as it is). Read-only; e.g. 8765.")
@click.option("--local-port", type=PORT, default=None,
              help="This machine's end of the --serve forward (default: the same port as the board's).")
@click.option("--remote-dir", default=None, help="Where the board keeps hydra-edge's files.")
@click.option("--identity", "identity_file", default=None, help="ssh private key.")
@click.option("--known-hosts", default=None, help="ssh known_hosts file (host keys are always checked).")
@click.option("--ssh-config", default=None, help="ssh config file (default: ~/.ssh/config).")
def deploy(bundle: Path | None, lut_path: Path | None, apk: Path | None, serial: str | None, adb_port: int | None,
           host: str | None, local: bool, images: Path | None, camera: int | None,
           max_images: int | None, python: str | None, setup: bool, pip_args: tuple[str, ...], detach: bool,
           fresh: bool, serve_port: int | None, local_port: int | None, remote_dir: str | None, identity_file: str | None,
           known_hosts: str | None, ssh_config: str | None) -> None:
    """Push the board demo app, the artefacts and the lookup table to a board and start the app.

    Example: hydra-edge deploy --bundle bundles/rpi --lut lut/ --host pi@raspberrypi.local --images photos --setup

    A phone: hydra-edge deploy --serial R58M12345 --apk demo.apk
    """
    if apk is not None or serial is not None or adb_port is not None:
        given = (("--bundle", bundle), ("--lut", lut_path), ("--host", host), ("--local", local),
                 ("--images", images), ("--camera", camera), ("--max-images", max_images), ("--python", python),
                 ("--setup", setup), ("--pip-arg", pip_args), ("--detach", detach), ("--fresh", fresh),
                 ("--serve", serve_port),
                 ("--local-port", local_port), ("--remote-dir", remote_dir), ("--identity", identity_file),
                 ("--known-hosts", known_hosts), ("--ssh-config", ssh_config))
        board = [name for name, value in given if value is not None and value is not False and value != ()]
        if apk is None:
            raise click.UsageError("--serial and --adb-port deploy to a phone: give --apk demo.apk "
                                   "(built by hydra-edge android-app)")
        if board:
            raise click.UsageError(f"--apk carries its bundle and table and runs on the phone; drop {', '.join(board)}")
        check_phone_args(apk, serial)
        deploy_phone(apk, serial, adb_port)
        return
    if bundle is None or lut_path is None:
        raise click.UsageError(f"Missing option '{'--bundle' if bundle is None else '--lut'}' "
                               "(a phone takes --serial and --apk instead)")
    if bool(host) == local:
        raise click.UsageError("name the board with --host, or --local for this machine")
    if (images is None) == (camera is None):
        raise click.UsageError("give exactly one of --images and --camera")
    if serve_port is not None and detach:
        raise click.UsageError("--serve forwards the live page while deploy runs the app, and --detach leaves it; "
                               "drop --detach (Ctrl-C stops the app and the forward)")
    if local_port is not None and serve_port is None:
        raise click.UsageError("--local-port is the local end of --serve's forward; give --serve PORT too")
    lut_file = lut_path / "lut.json" if lut_path.is_dir() else lut_path
    options = {k: v for k, v in {"remote_dir": remote_dir, "identity_file": identity_file,
                                 "known_hosts": known_hosts, "ssh_config": ssh_config}.items() if v is not None}
    if local:  # the app, its files and its log stay after deploy returns: said, with how to clear them
        options.setdefault("remote_dir", str(local_board_dir()))
    kept = local_state(Path(options["remote_dir"]), fresh) if local else None  # before the board is opened
    python = device_python(python, local)
    app_args = ["--plain"] + (["--max-images", str(max_images)] if max_images is not None else [])
    if serve_port is not None:
        app_args += ["--serve", f"{LOOPBACK}:{serve_port}"]
    # Ctrl-C stops the device command running (its transport's doing) and closes the forward; the
    # command's summary follows (``base.Command``)
    with DeviceArg("local", None).open(options) if local else DeviceArg("host", host).open(options) as transport, \
            transport.forward(serve_port, local_port) if serve_port is not None else nullcontext() as page_port:
        # the forward is up (its local port checked) before anything is sent, and down once the app ends
        deploy_to(transport, bundle, lut_file, images, camera, python, setup, pip_args, app_args, detach,
                  None if page_port is None else page_line(transport, page_port, serve_port), fresh, kept)
