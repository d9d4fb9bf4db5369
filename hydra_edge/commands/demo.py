"""``hydra-edge demo``: the whole pipeline on built-in data, no downloads.

train (digits) -> convert (rpi: LiteRT int8, or jetson: ONNX fp16; a compact bundle, every head
count rebuilt on the device from the largest one's weights) -> calibrate (this machine as the
device) -> lut (battery x thermal table) -> the board demo app replaying a scripted day on a
simulated sysfs tree. Each stage is the real command a user would type (invoked with the same
options), so the demo shows exactly what each command shows; re-running it resumes or skips
finished work.

``--serve`` has the app serve its live page while the day plays, the day paced so that a person
sees each step (``--pace``); ``--hold`` keeps the page's last state served after the day, until Ctrl-C.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Callable
from urllib.parse import urlsplit

import click

from ..atomic import write_json, write_text
from ..errors import HydraEdgeError
from ..runtime.live_page import URL_LINE
from ..runtime.terminal import shown, shown_lines
from ..shipped import package_path
from .base import Number, command
from .calibrate import RUNS
from .convert import JOBS
from .deploy import APP
from .train import EPOCHS

if TYPE_CHECKING:
    from ..runtime.live_page import PageState

DEMO_CAP_S = 10.0  # calibrate's --cap-seconds in the demo
SERVE = "127.0.0.1:8765"  # --serve without an address: the board app's documented example, on loopback
PACE_S = 2.0  # seconds of inference a step of the day classifies for while serving: long enough to watch

# A day on a battery-powered board: plugged in, unplugged, working hard and heating up, cooling
# off, running low, plugged in again. ``seconds`` is simulated time (longer than the table's dwell).
SCENARIO = [
    ("on the charger, cool", 100, "Charging", 45.0),
    ("unplugged", 92, "Discharging", 48.0),
    ("heavy use, warming", 84, "Discharging", 63.0),
    ("heavy use, hot", 76, "Discharging", 74.0),
    ("heavy use, very hot", 68, "Discharging", 84.0),
    ("fan on, cooling", 60, "Discharging", 66.0),
    ("cool again", 54, "Discharging", 50.0),
    ("battery under half", 42, "Discharging", 50.0),
    ("battery low", 18, "Discharging", 50.0),
    ("back on the charger", 20, "Charging", 47.0),
]


# The boards the demo plays: (what the stage line calls it, the one artefact variant it converts).
BOARDS = {"rpi": ("the Raspberry Pi profile on a UPS battery (LiteRT, int8)", None),
          "jetson": ("the Jetson profile on a battery (ONNX fp16)", "fp16")}
# The scripted day runs on a battery: the shipped profiles name none (boards on mains), so the demo's
# copy names the power supply the simulated board writes.
BATTERY = ('battery_capacity = "/sys/class/power_supply/battery/capacity"\n'
           'battery_status = "/sys/class/power_supply/battery/status"\n')


def board_profile(target: str) -> str:
    """The shipped ``target`` profile with a battery named (as a UPS HAT or a battery carrier board adds),
    and without a ``vcgencmd measure_temp`` line: the simulated board has no vcgencmd, and a named
    temperature that never reads is the hottest band (as on a Pi whose OS lacks vcgencmd)."""
    from ..convert.targets import resolve
    from ..runtime.signals.state import tool_of

    lines = resolve(target).read_text().replace("[signals.files]\n", "[signals.files]\n" + BATTERY, 1).splitlines()
    return "\n".join(line for line in lines if tool_of(line.partition("=")[2].strip().strip('"')) != "measure_temp") + "\n"


def scenario_steps(images_per_step: int, seconds: float = 30.0) -> list[dict]:
    return [{"label": label, "battery_pct": pct, "status": status, "temp_c": temp, "seconds": seconds,
             "images": images_per_step} for label, pct, status, temp in SCENARIO]


def export_images(checkpoint: Path, folder: Path, limit: int) -> Path:
    """Held-out digits as 8-bit PNGs in class folders: what a camera or an image folder would give."""
    import numpy as np
    from PIL import Image

    from ..model.checkpoint import load_checkpoint_file
    from ..train.data import DataSpec, as_arrays, load_data

    model, saved = load_checkpoint_file(checkpoint)
    spec = DataSpec.from_dict(saved["data"])
    x, y = as_arrays(load_data(spec, model.config).val, limit)
    pixels = np.clip(np.rint((x[:, 0] * 0.5 + 0.5) * 255), 0, 255).astype(np.uint8)  # undo (v - 0.5) / 0.5
    for i, (image, label) in enumerate(zip(pixels, y)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, mode="L").save(folder / str(label) / f"{i:04d}.png")
    return folder


def demo_budget(bundle: Path, calibration: Path) -> float:
    """A budget the most accurate subnetwork just meets when cool on mains, so heat and battery show.

    The most accurate is the top of this device's Pareto front (ties go to fewer heads).
    """
    from ..lut.table import points
    from ..measure.journal import read_calibration
    from ..measure.pareto import pareto
    from ..records.manifest import read_manifest

    front, _ = pareto(points(read_manifest(bundle), read_calibration(calibration))[0])
    return round(front[-1].latency_ms * 1.1, 4)


def loop_budget(budget_ms: float, calibration: Path) -> float:
    """The budget the app's latency loop holds the p90 to: the table's, widened by the calibration's
    widest tail (the largest p90 / p50 of a head count) and at least doubled, so the unloaded device
    meets it in every cell of the table (which plans with the median) and the scripted day shows the
    table's switches. The digits model runs in a fraction of a millisecond, where a busy desktop's
    scheduling adds tens of percent to the p90; another process on the same cores halves the
    device's share of them, which still trips it."""
    from ..measure.journal import read_calibration

    tails = [r.latency["p90_ms"] / r.latency_ms for r in read_calibration(calibration).measured()
             if r.latency and r.latency.get("p90_ms") and r.latency_ms > 0]
    return round(budget_ms * max([2.0, *tails]), 4)


def paced_images(images_per_step: int, pace_s: float, calibration: Path) -> int:
    """Images a step classifies so that it lasts about ``pace_s`` real seconds (at least ``images_per_step``).

    The app plays the day on a simulated clock as fast as it classifies, which without a page to watch
    is the point (the demo is quick); while serving, the day is paced by classifying more: from the
    calibrated median latency of the head counts, so the page charts a steady stream of real inferences.
    """
    from ..measure.journal import read_calibration

    measured = [r.latency_ms for r in read_calibration(calibration).measured() if r.latency_ms > 0]
    if not measured:
        return images_per_step
    return max(images_per_step, round(pace_s * 1000 / statistics.median(measured)))


def check_page_address(address: str, allow_remote: bool) -> tuple[str, int]:
    """``--serve``'s ``(host, port)``, bound and released now with the app's own server, so an address the
    app would refuse (not HOST:PORT, a port in use, not loopback without --serve-remote) is its one line
    before training starts, not after it."""
    from ..runtime.live_page import LivePage, PageState, parse_address

    host, port = parse_address(address)
    with LivePage(lambda: PageState(heads=0), host, port, allow_remote=allow_remote):
        pass
    return host, port


class LastState:
    """The latest ``/state.json`` of the app's page, read each tick while the app runs: what ``--hold``
    serves once the app has ended (the page as a watcher last saw it, chart and switches included)."""

    def __init__(self, url: str) -> None:
        self.url, self.body = url, b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="demo-page-state", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        from ..runtime.live_page import TICK_S

        while not self._stop.wait(TICK_S / 2):
            try:
                with urllib.request.urlopen(self.url + "state.json", timeout=5) as reply:
                    self.body = reply.read()
            except OSError:  # the page has stopped (the day is over) or is between ticks
                pass

    def state(self) -> PageState:
        from msgspec import json

        from ..runtime.live_page import Tick

        self._stop.set()
        self._thread.join()
        last = json.decode(self.body, type=Tick).state if self.body else None
        if last is None:
            raise HydraEdgeError(f"the live page at {self.url} was never read, so there is no state to hold; "
                                 "run the demo again without --hold")
        return last


def play(command: list[str], on_page: Callable[[str], None]) -> None:
    """Run the board app, showing its output as it comes; ``on_page(url)`` once its page serves.

    The app's stderr joins its stdout (its warnings in order with its switches, as deploy shows them);
    its ``Error:`` line, when it fails, is the demo's one error line. Ctrl-C reaches the app too
    (same terminal): it stops and prints its summary, which is shown before the demo stops. SIGTERM to the
    demo alone (a supervisor's stop, ``kill``) is forwarded to the app, which treats it as Ctrl-C.
    """
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**_env(), "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    error = ""
    try:
        for line in (shown(raw.rstrip("\n")) for raw in proc.stdout):  # the app's text, never terminal commands
            if line.startswith("Error: "):
                error = line.removeprefix("Error: ").strip()
                continue
            click.echo(line)
            if line.startswith(URL_LINE):
                on_page(line.removeprefix(URL_LINE).strip())
        proc.wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM to the demo alone: stop the app as Ctrl-C does
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # its first stop signal counts; a second is ignored, summary kept
        try:
            click.echo(shown_lines(proc.communicate(timeout=10)[0]), nl=False)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    if proc.returncode != 0:
        raise HydraEdgeError(error or f"the board demo app failed with exit {proc.returncode} (its output is above); "
                                      f"run it by hand: {' '.join(command)}")


def hold_page(state: PageState, host: str, url: str, allow_remote: bool) -> None:
    """Serve the day's last page state where the app served it until Ctrl-C; a browser left open on the page
    reconnects to it by itself."""
    from ..runtime.live_page import LivePage

    with LivePage(lambda: state, host, urlsplit(url).port or 0, allow_remote=allow_remote) as page:
        click.echo(f"{URL_LINE}{page.url} holds the day's end; Ctrl-C stops it")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            click.echo("stopped serving the live page")


def _stage(n: int, title: str) -> None:
    from rich.console import Console

    text = f"{n}/5 {title}"  # piped or logged, rich's 80 columns would cut the title: the rule is as wide as it
    Console(stderr=True, width=None if sys.stderr.isatty() else len(text) + 8).rule(f"[bold]{text}")


@command(kept=lambda params: f"every finished stage is kept in {params['out']}, and the stage it stopped in "
                            "goes on from its last epoch, artefact or head count")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("hydra-edge-demo"),
              show_default=True, help="Folder for everything the demo makes.")
@click.option("--epochs", default=30, show_default=True, type=EPOCHS, help="Training epochs on digits.")
@click.option("--heads", default="3-12", show_default=True, help="Head counts to train, convert and calibrate.")
@click.option("--runs", default=30, show_default=True, type=RUNS, help="Timed runs per head count in calibration.")
@click.option("--images", "images_per_step", default=40, show_default=True, type=Number(1, 100_000, integer=True),
              help="Images classified per scenario step.")
@click.option("--jobs", default=None, type=JOBS,
              help="Parallel conversion processes (default: as many as the cores and memory hold).")
@click.option("--target", type=click.Choice(sorted(BOARDS)), default="rpi", show_default=True,
              help="The board the demo converts for and plays.")
@click.option("--serve", is_flag=False, flag_value=SERVE, default=None, metavar="[HOST:PORT]",
              help=f"Serve the board app's live page while the day plays (alone: {SERVE}); its URL is printed.")
@click.option("--serve-remote", is_flag=True, help="Let --serve listen on an address that is not loopback.")
@click.option("--pace", "pace_s", default=PACE_S, show_default=True, type=Number(0.1, 600),
              help="With --serve: seconds of inference each step of the day classifies for, at the calibrated "
                   "latency (the app's own work per image comes on top).")
@click.option("--hold", is_flag=True, help="With --serve: keep the page's last state served after the day, "
                                           "until Ctrl-C.")
@click.pass_context
def demo(ctx: click.Context, out: Path, epochs: int, heads: str, runs: int, images_per_step: int, jobs: int | None,
         target: str, serve: str | None, serve_remote: bool, pace_s: float, hold: bool) -> None:
    """Train, convert, calibrate, build the lookup table and run the board app: all on built-in data.

    Example: hydra-edge demo --serve
    """
    from ..runtime.closed_loop import correction_path
    from .calibrate import calibrate
    from .convert import convert
    from .lut import lut
    from .train import train

    paced = ctx.get_parameter_source("pace_s") is click.core.ParameterSource.COMMANDLINE
    for given, name in ((hold, "hold"), (serve_remote, "serve-remote"), (paced, "pace")):
        if given and serve is None:
            raise click.UsageError(f"--{name} is about the live page; give --serve too")
    page_host = check_page_address(serve, serve_remote)[0] if serve is not None else None
    start = time.perf_counter()
    run, bundle, calibration, table, app = (out / n for n in ("run", "bundle", "calibration", "lut", "app"))
    checkpoint = run / "checkpoint.pt"

    _stage(1, f"train HydraViT on digits, heads {heads}, {epochs} epochs")
    ctx.invoke(train, data="digits", out=run, heads=heads, epochs=epochs, threads=1, resume=True)

    board, quant = BOARDS[target]
    _stage(2, f"convert every subnetwork for {board}, verified; one weight set (compact bundle)")
    profile = out / f"{target}-battery.toml"
    write_text(profile, board_profile(target))
    ctx.invoke(convert, checkpoint=checkpoint, targets=(str(profile),), out=bundle, jobs=jobs, quant=quant)

    _stage(3, "calibrate: this machine plays the board (ssh/adb work the same way)")
    record = calibration / "this-machine.json"
    # A cap a head count bounds the demo's calibration on a busy machine (calibrate's own is 60 s).
    ctx.invoke(calibrate, bundle=bundle, local=True, out=record, runs=runs, warmup=5, threads=1,
               python=sys.executable, cap_seconds=DEMO_CAP_S)

    budget = demo_budget(bundle, record)
    _stage(4, f"lookup table: budget {budget} ms (the most accurate subnetwork's latency + 10 %)")
    ctx.invoke(lut, bundle=bundle, calibration=record, budget_ms=budget, out=table)

    held = loop_budget(budget, record)
    _stage(5, "board demo app: a scripted day (battery and temperature) on a simulated sysfs tree, "
              f"latency p90 held to {held} ms")
    images = export_images(checkpoint, app / "images", limit=200)
    # Each replay of the day starts from the table, as a freshly deployed board does: a correction the
    # latency loop learned on an earlier replay (under whatever else this machine ran then) would cap
    # the head count from the first step and hide the day's switches.
    correction_path(table / "lut.json").unlink(missing_ok=True)
    scenario = app / "scenario.json"
    if serve is not None:
        images_per_step = paced_images(images_per_step, pace_s, record)
    write_json(scenario, {"steps": scenario_steps(images_per_step)})
    for i, (label, pct, status, temp) in enumerate(SCENARIO):
        click.echo(f"  step {i + 1:>2}: {label:<22} battery {pct:>3}% {status:<11} {temp:.0f} °C")
    log, runtime_log = app / "events.json", app / "runtime.log"
    command = [sys.executable, str(APP), "--bundle", str(bundle), "--lut", str(table / "lut.json"),
               "--images", str(images), "--scenario", str(scenario), "--sysfs-root", str(app / "sysfs"),
               "--threads", "1", "--budget-ms", str(held), "--plain", "--log", str(log),
               "--runtime-log", str(runtime_log)]
    if serve is not None:
        command += ["--serve", serve, *(["--serve-remote"] if serve_remote else [])]
    watched: list[LastState] = []  # the page's state, read while the day plays (--hold)
    play(command, lambda url: watched.append(LastState(url)) if hold else None)

    click.echo(f"\nDone in {time.perf_counter() - start:.0f} s. Where everything is:")
    for what, where in [
        ("checkpoint, history, accuracy per head count (JSON + PNG)", run),
        ("bundle: artefacts (or skeletons + recipes), golden pairs, manifest.json", bundle),
        ("calibration of this machine (JSON + Pareto PNG)", record),
        ("lookup table: lut.json, hydra_lut.h, HydraLut.kt, lut.md, lut.png", table),
        ("board app run: images, scenario, switch events, runtime output", app),
    ]:
        click.echo(f"  {what:<66} {where}")
    if watched:
        hold_page(watched[0].state(), page_host, watched[0].url, serve_remote)


def _env() -> dict[str, str]:
    """The app imports hydra_edge.runtime from this checkout, as a board would from the pushed copy."""
    import os

    root = str(package_path("hydra_edge").parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
