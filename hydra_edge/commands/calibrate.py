"""``hydra-edge calibrate``: measure a bundle's latency per head count on one device or a fleet."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from ..bounds import MAX_CAP_S, MAX_RUNS, MAX_THREADS, SOAK_INTERVAL_S, WITHIN
from ..errors import HydraEdgeError
from ..lock import exclusive
from ..logs import device_log
from ..measure.app import APP_IDLE_S
from ..measure.device import device_python
from ..measure.rounds import findings
from ..measure.session import CalibrateOptions, RoundsOptions, Session, safe_name
from ..measure.soak import parse_duration
from ..records.calibration import Calibration
from ..runtime.terminal import rich_shown, shown
from ..transport import DeviceArg, Transport
from .base import Number, command

RUNS = Number(1, MAX_RUNS, integer=True)  # timed runs per head count; demo passes its own through
THREADS = Number(1, MAX_THREADS, integer=True)
APP = "app"  # --runner app: the phone's demo app times the bundle its APK carries


class RunnerArg(click.ParamType):
    """``--runner``: ``app`` (the demo app on the phone), else a native benchmark binary that exists here."""

    name = "app|PATH"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == APP or isinstance(value, Path):
            return value
        return click.Path(dir_okay=False, exists=True, path_type=Path).convert(value, param, ctx)


def _devices(hosts: tuple[str, ...], serial: str | None, local: bool) -> list[DeviceArg]:
    named = [kind for kind, given in (("--host", hosts), ("--serial", serial), ("--local", local)) if given]
    if len(named) > 1:
        raise HydraEdgeError(f"name devices of one kind, not {' and '.join(named)}")
    if hosts:
        return [DeviceArg("host", h) for h in dict.fromkeys(hosts)]
    if local:
        return [DeviceArg("local", None)]
    return [DeviceArg("serial", serial)]  # None: ANDROID_SERIAL, or the one attached phone


def _out_path(out: Path, device_id: str, several: bool) -> Path:
    if out.suffix == ".json":
        if several:
            raise HydraEdgeError(f"--out {out} names one file; with several devices give a folder")
        return out
    return out / f"{safe_name(device_id)}.json"


class _Progress:
    """A rich progress bar per device (device, head count, stage), safe to update from threads."""

    def __init__(self, console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

        self.bar = Progress(SpinnerColumn(), TextColumn("{task.fields[device]}"),
                            TextColumn("heads {task.fields[heads]}"), TextColumn("{task.description}"),
                            BarColumn(), MofNCompleteColumn(), console=console, transient=False)

    def __enter__(self) -> "_Progress":
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the bars. With none shown (every device failed before its first), rich would leave an empty
        line above the error (its last render, ended where the output is no terminal): nothing is left."""
        if self.bar.tasks:
            self.bar.stop()
        else:
            self.bar.live.transient = True
            self.bar.live.stop()

    def say(self, text: str) -> None:
        """One line above the bars (``_say``)."""
        _say(self.bar.console, text)

    def reporter(self, device: str, total: int):
        task = self.bar.add_task("connecting", device=rich_shown(device), heads="-", total=total)

        def report(stage: str, heads: int | None) -> None:
            self.bar.update(task, description=stage, heads="-" if heads is None else heads,
                            advance=1 if stage in ("ok", "golden_failed", "error") else 0)
        return report


def _calibrate_one(device: DeviceArg, options: dict[str, Any], opts: CalibrateOptions, out: Path, several: bool,
                   progress: _Progress, transports: list[Transport], wait: bool) -> tuple[Calibration, Path, Path]:
    from ..measure.plot import plot_calibration
    from ..records.manifest import read_manifest

    with device.open(options) as transport:
        transports.append(transport)
        path = _out_path(out, transport.device_id, several)
        path.parent.mkdir(parents=True, exist_ok=True)
        # One calibration per record file: two writing it would each drop what the other saved.
        with exclusive(path.with_name(path.name + ".lock"), f"calibration record {path}", wait,
                       say=progress.say):
            session = Session(transport, opts, path)
            session.report = progress.reporter(transport.device_id, len(session.artefacts))
            session.echo = progress.say
            calibration = session.run()
    png = plot_calibration(calibration, read_manifest(opts.bundle), path.with_suffix(".png"))
    return calibration, path, png


def _say(console: Any, text: str) -> None:
    """One line on the terminal, escaped (``terminal.shown``): what calibrate prints comes from the device (its
    name, its board's, its runner's and runtimes' words, artefact names from records) or from files, and a
    device's ESC or OSC sequence must be printed, never obeyed, a newline never forge a line of its own; nor
    is it rich markup or emoji codes."""
    console.print(shown(text), markup=False, highlight=False, emoji=False, soft_wrap=True)


def _figure(value: Any) -> str:
    """A figure to three decimals, or '-' where the record has none."""
    return f"{value:.3f}" if isinstance(value, float) else "-"


def _summary(console: Any, calibration: Calibration, path: Path, png: Path) -> None:
    from rich.table import Table

    board = calibration.device.get("model") or calibration.device.get("cpu_model") or ""
    # Two tables, each within an 80-column terminal: what was timed, and what loading cost.
    timing = Table(title=rich_shown(f"{calibration.device_id}: {board}"))
    for column in ("heads", "status", "p50 ms", "p90 ms", "p90 95 % interval", "runs", "stopped by"):
        timing.add_column(column, justify="right")
    loading = Table(title="loading each head count")
    for column in ("heads", "load s", "rebuild s", "peak RSS MiB"):
        loading.add_column(column, justify="right")
    for r in calibration.results:
        lat, interval = r.latency or {}, r.p90_interval_ms
        timing.add_row(str(r.heads), r.status, *(_figure(v) for v in (lat.get("p50_ms") or lat.get("mean_ms"),
                                                                 lat.get("p90_ms"))),
                       f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else "-", str(lat.get("count") or "-"),
                       r.stopped or "-")
        loading.add_row(str(r.heads), *(_figure(v) for v in (r.load_s, r.rebuild_s, r.peak_rss_mb)))
    console.print(timing)
    console.print(loading)
    for r in calibration.results:
        if r.error:
            _say(console, f"{r.heads} heads: {r.error}")
    for line in findings(calibration):
        _say(console, f"{calibration.device_id}: {line}")
    if calibration.soak:
        steps = ", ".join(f"{t:g} °C x{m:.2f}" for t, m in calibration.soak.by_temperature)
        console.print(f"soak ({calibration.soak.heads} heads, {calibration.soak.duration_s:g} s): {steps or 'no temperatures'}")
    _say(console, f"wrote {path} and {png}")
    if device_log(path).is_file():
        _say(console, f"the device's own output: {device_log(path)}")


@command(kept=lambda params: f"each head count measured and each block of runs timed so far is saved in "
                            f"{params['out']}; the rest are measured, going on from those blocks, when it resumes")
@click.option("--bundle", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="A bundle folder made by hydra-edge convert.")
@click.option("--host", "hosts", multiple=True, help="ssh device: user@host[:port] or an ssh config alias; repeat for a fleet.")
@click.option("--serial", default=None, help="adb device serial (ANDROID_SERIAL is honoured).")
@click.option("--local", is_flag=True, help="This machine is the device.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("calibration"), show_default=True,
              help="Folder for <device-id>.json and .png, or a .json file for one device.")
@click.option("--runs", default=50, show_default=True, type=RUNS,
              help="Timed runs per head count at least.")
@click.option("--warmup", default=10, show_default=True, type=Number(0, MAX_RUNS, integer=True), help="Untimed runs first.")
@click.option("--within", default=0.05, show_default=True, type=Number(*WITHIN),
              help="Every runner: time each head count until its p90's 95 % interval is within this share of it.")
@click.option("--min-seconds", default=1.0, show_default=True, type=Number(0, MAX_CAP_S),
              help="Every runner: timed seconds per head count at least.")
@click.option("--cap-seconds", default=60.0, show_default=True, type=Number(0, MAX_CAP_S),
              help="Every runner: seconds per head count at most, its interval met or not.")
@click.option("--block-seconds", default=0.25, show_default=True, type=Number(0, MAX_CAP_S),
              help="Every runner: timed seconds per head count per round (at least 5 runs).")
@click.option("--block-warmup", default=2, show_default=True, type=Number(0, MAX_RUNS, integer=True),
              help="Every runner: untimed runs before each block after a head count's first.")
@click.option("--gate-headroom", default=0.7, show_default=True, type=Number(0, 10),
              help="Every runner: a round starts once Android's thermal headroom forecast is at most this (or the start's).")
@click.option("--gate-margin", default=2.0, show_default=True, type=Number(0, 100),
              help="Every runner: a round starts once the device is within this many °C of its start.")
@click.option("--gate-max-wait", default=120.0, show_default=True, type=Number(0, MAX_CAP_S),
              help="Every runner: the longest a round waits for the device to cool.")
@click.option("--threads", default=None, type=THREADS, help="Runtime threads (default: the target's).")
@click.option("--quant", default=None, help="Which artefacts, when the bundle has several per head count.")
@click.option("--python", "python", default=None,
              help="The device's Python interpreter (default: python3; with --local, the one running hydra-edge).")
@click.option("--setup", is_flag=True, help="Create a venv on the device and pip install numpy and the runtime (reused).")
@click.option("--pip-arg", "pip_args", multiple=True, help="Extra argument for pip on the device, e.g. --index-url=URL.")
@click.option("--runner", type=RunnerArg(), default=None,
              help="A native benchmark binary to push instead (benchmark_model for .tflite, executor_runner for .pte, "
                   "trtexec for .onnx); a compact bundle's artefacts go to it rebuilt, as files. 'app': a phone "
                   "(--serial) is timed by the demo app that deploy --apk installed, in its bench mode (./app for a "
                   "binary named app).")
@click.option("--app-timeout", default=APP_IDLE_S, show_default=True, type=Number(1, 86400),
              help="With --runner app: seconds without a new line from the app before giving up.")
@click.option("--soak", default=None, help="Also run the largest head count this long (e.g. 10m) for a derating curve.")
@click.option("--soak-interval", default=5.0, show_default=True, type=Number(*SOAK_INTERVAL_S),
              help="Seconds per soak sample.")
@click.option("--remote-dir", default=None, help="Where the device keeps hydra-edge's files.")
@click.option("--identity", "identity_file", default=None, help="ssh private key.")
@click.option("--known-hosts", default=None, help="ssh known_hosts file (host keys are always checked).")
@click.option("--ssh-config", default=None, help="ssh config file (default: ~/.ssh/config).")
@click.option("--adb-port", default=None, type=Number(1, 65535, integer=True), help="Port of the adb server.")
@click.option("--force", is_flag=True, help="Measure again what the record already holds.")
@click.option("--no-wait", is_flag=True, help="If another calibration is writing the same record, stop instead of waiting.")
@click.option("--sysfs-root", default=None, hidden=True, help="Tests: the device reads /sys under this root.")
def calibrate(bundle: Path, hosts: tuple[str, ...], serial: str | None, local: bool, out: Path, runs: int,
              warmup: int, threads: int | None, quant: str | None, python: str | None, setup: bool,
              pip_args: tuple[str, ...], runner: Path | str | None, app_timeout: float, soak: str | None,
              soak_interval: float, within: float, min_seconds: float, cap_seconds: float, block_seconds: float,
              block_warmup: int, gate_headroom: float, gate_margin: float, gate_max_wait: float,
              remote_dir: str | None, identity_file: str | None, known_hosts: str | None, ssh_config: str | None,
              adb_port: int | None, force: bool, no_wait: bool, sysfs_root: str | None) -> None:
    """Measure latency per head count on a device over ssh, adb, or this machine.

    The Python runner times every head count in rounds, each in a new random order and started once the
    device is back at its starting temperature, until each p90 is known to --within (a 95 % interval),
    within --cap-seconds per head count. Saves each block of runs as it is measured; run the same
    command again after a dropped connection or Ctrl-C and it goes on with the rounds. Exits non-zero
    when any head count failed.

    Example: hydra-edge calibrate --bundle bundles/rpi --host pi@raspberrypi.local
    """
    from rich.console import Console

    app = runner == APP
    if app:
        _check_app_options(hosts, local, setup, pip_args, python, soak)
    opts = CalibrateOptions(bundle=bundle, runs=runs, warmup=warmup, threads=threads, quant=quant,
                            python=device_python(python, local), setup=setup, pip_args=pip_args,
                            runner=None if app else runner, app=app, app_idle_s=app_timeout,
                            soak_s=parse_duration(soak) if soak else None, soak_interval_s=soak_interval,
                            sysfs_root=sysfs_root, force=force,
                            plan=RoundsOptions(within=within, min_s=min_seconds, cap_s=cap_seconds,
                                               block_s=block_seconds, block_warmup=block_warmup,
                                               gate_margin_c=gate_margin, gate_headroom=gate_headroom,
                                               gate_max_wait_s=gate_max_wait))
    devices = _devices(hosts, serial, local)
    options = {k: v for k, v in {"remote_dir": remote_dir, "identity_file": identity_file, "known_hosts": known_hosts,
                                 "ssh_config": ssh_config, "adb_port": adb_port}.items() if v is not None}
    _run_all(devices, options, opts, out, Console(), wait=not no_wait)


def _check_app_options(hosts: tuple[str, ...], local: bool, setup: bool, pip_args: tuple[str, ...],
                       python: str | None, soak: str | None) -> None:
    """--runner app: the phone's app carries its runtime and has no soak mode; say so rather than ignore."""
    if hosts or local:
        raise click.UsageError("--runner app runs the demo app on an Android phone: name it with --serial")
    given = [name for name, on in (("--setup", setup), ("--pip-arg", pip_args), ("--python", python),
                                   ("--soak", soak)) if on]
    if given:
        raise click.UsageError(f"--runner app times with the runtime the app carries and has no soak mode; "
                               f"drop {', '.join(given)}")


def _run_all(devices: list[DeviceArg], options: dict[str, Any], opts: CalibrateOptions, out: Path, console: Any,
             wait: bool = True) -> None:
    """Calibrate every device, concurrently for a fleet; each failure is one line, the rest go on."""
    several = len(devices) > 1
    progress, transports = _Progress(console), []
    # not a with-block: on Ctrl-C the transports must close (ending the workers' device commands)
    # before the pool joins its workers, or every device would run to its end first
    pool = ThreadPoolExecutor(max_workers=len(devices)) if several else None
    with progress:
        try:
            if pool is None:
                done = [_calibrate_one(devices[0], options, opts, out, several, progress, transports, wait)]
                failures: list[str] = []
            else:
                futures = [pool.submit(_calibrate_one, t, options, opts, out, several, progress, transports, wait)
                           for t in devices]
                outcomes = [_outcome(f) for f in futures]
                done = [o for o in outcomes if not isinstance(o, str)]
                failures = [f"{t.name}: {o}" for t, o in zip(devices, outcomes) if isinstance(o, str)]
        except KeyboardInterrupt:  # wherever it lands: in a device stream, a save or the progress bar
            for transport in list(transports):  # stops every device's command and drops ssh masters
                transport.close()
            raise  # the command's summary says what was saved and how to go on
        finally:
            if pool is not None:
                pool.shutdown()
    for calibration, path, png in done:
        _summary(console, calibration, path, png)
    for line in failures:
        _say(console, line)
    if failures:
        raise HydraEdgeError(f"{len(failures)} of {len(devices)} devices failed (see above); "
                             "run the same command again to finish them")
    failed = [line for calibration, _, _ in done for line in _failed_heads(calibration)]
    if failed:
        raise HydraEdgeError(f"{len(failed)} head count(s) failed: {'; '.join(failed)}; the others are saved")


def _failed_heads(calibration: Calibration) -> list[str]:
    """One phrase per head count that has no valid measurement: which device, which heads, why."""
    return [f"{calibration.device_id} {r.heads} heads {r.status}"
            + (f" ({(r.error or '').splitlines()[0][:160]})" if r.error else "")
            for r in calibration.results if not r.ok]



def _outcome(future: Any) -> Any:
    """The future's result, or its one-line error message."""
    try:
        return future.result()
    except HydraEdgeError as e:
        return str(e)
