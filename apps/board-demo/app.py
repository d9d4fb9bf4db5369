#!/usr/bin/env python3
"""Board demo: classify images with the subnetwork the battery and temperature allow, live.

Runs on a Raspberry Pi or Jetson with numpy, msgspec, Pillow and the bundle's runtime (no torch): the
switcher (``hydra_edge.runtime``) reads the board's thermal zones and battery, the bundle's
lookup table picks the head count, and every switch is shown as it happens with the accuracy
and latency it bought. The switcher's latency loop is on: each inference is timed, and when the
head count's p90 stays over the table's budget (another process on the same cores, a hotter room)
fewer heads run until the slow-down has gone; each switch is printed with its reason. How soon it
reacts is ``--loop-window-s``, ``--loop-sustain-s`` and ``--loop-dwell-s`` (shorter: the budget is
missed for less time, and a shorter burst of load costs heads). Images come
from a folder (class per sub-folder gives live accuracy) or from a camera through OpenCV when
``--camera`` is given. Each prediction is shown by its class name when the bundle has names (its
manifest's ``classes``), by its index otherwise. With ``--plain`` (what ``deploy`` and ``demo`` stream)
the app prints each switch as it happens and, every ``--summary-s`` seconds, one line of what it
served since it started (images, rate, head count, p50/p90 of the inferences alone, live top-1 where the
images are labelled, switches): a board classifies hundreds of images a second, and a line for each would
bury the switches; ``--each-image`` adds a line per image. Each line has the live accuracy, so a run
stopped before its totals still showed it.

Times (the switches on the live page, its chart, the ``--log`` events) are seconds since the app
started, or on the scripted day's clock when one plays: never the machine's uptime.

``--scenario`` replays a scripted day instead of reading the real board: it writes battery and
temperature into a simulated sysfs tree (``--sysfs-root``) step by step on a simulated clock,
which is how ``hydra-edge demo`` shows switching on a machine that has neither. A step's images
are spread over its polls, so the latency loop sees inferences through the simulated day as a
board would (and the day's switches happen at the same simulated times whatever the host's speed).

    python app.py --bundle bundle --images images [--camera 0] [--scenario s.json --sysfs-root sim]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import statistics
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

import numpy as np

from hydra_edge.atomic import read_json, write_json
from hydra_edge.bounds import MAX_CAMERA, MAX_IMAGES, MAX_THREADS, POLL_S, number_arg
from hydra_edge.errors import HydraEdgeError
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.chatter import native_output_to
from hydra_edge.runtime.engines import check_runtimes, runtimes_of
from hydra_edge.runtime.latency import percentile
from hydra_edge.runtime.latency_governor import LoopSettings
from hydra_edge.runtime.live_page import URL_LINE, LivePage, PageState, Point, Switch, parse_address
from hydra_edge.runtime.preprocess import image_files, load_image, skipped_line
from hydra_edge.runtime.switcher import Switcher, SwitchEvent, event_record
from hydra_edge.runtime.terminal import ShownFormatter, rich_shown, shown, stop_on_signals

MAX_BUDGET_MS = 60_000.0  # the loop ignores a timing over a minute as absurd: a larger budget could never be missed
MAX_LOOP_S = 86_400.0  # the loop's windows and dwell: a day is longer than any board waits to react
SUMMARY_S = 10.0  # between the plain output's summary lines: a few a minute, read as they come
Sample = Tuple[np.ndarray, Optional[int]]  # (C, H, W) image, label if known


def folder_images(folder: Path, img_size: int, in_chans: int, classes: Optional[List[str]]) -> List[Sample]:
    """Every readable image under ``folder``; the first sub-folder below it names the class (one of ``classes``).

    An image that cannot be read (truncated, not an image) costs one warning, not the run; what is no image
    file inside the folder (a link out of it, a FIFO, a loop: ``image_files``) one warning for all.
    """
    if not folder.is_dir():
        raise HydraEdgeError(f"image folder {folder} does not exist; give a folder of images")
    samples = []
    files, skipped = image_files(folder)
    line = skipped_line(folder, skipped)
    if line:
        logging.warning("%s", line)
    for f in files:
        parts = f.relative_to(folder).parts
        label = None
        if len(parts) > 1 and classes is not None:
            if parts[0] not in classes:
                raise HydraEdgeError(f"{folder / parts[0]} is not one of the model's classes {classes}; "
                                     "rename it, or put unlabelled images directly in the folder")
            label = classes.index(parts[0])
        try:
            samples.append((load_image(f, img_size, in_chans), label))
        except HydraEdgeError as e:
            logging.warning("warning: skipped %s", e)
    if not samples:
        raise HydraEdgeError(f"no images in {folder}; give a folder of images (a sub-folder per class for accuracy)")
    return samples


def class_name(index: int, classes: Optional[List[str]]) -> str:
    """A class as a person reads it: its name when the bundle has names, else its logit index."""
    return str(index) if classes is None else classes[index]


def camera_images(index: int, img_size: int, in_chans: int) -> Iterator[Sample]:
    """Frames from an OpenCV camera, through the same evaluation transform as the folder images."""
    try:
        import cv2
    except ImportError:
        raise HydraEdgeError("--camera needs OpenCV: pip install opencv-python-headless") from None
    from PIL import Image

    from hydra_edge.runtime.preprocess import transform

    capture = cv2.VideoCapture(index)
    if not capture.isOpened():
        raise HydraEdgeError(f"camera {index} cannot be opened; check the device or use --images")
    while True:
        ok, frame = capture.read()
        if not ok:
            return
        frame = cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY if in_chans == 1 else cv2.COLOR_BGR2RGB)
        yield transform(Image.fromarray(frame), img_size, in_chans), None


class SimulatedBoard:
    """A scripted battery and CPU temperature written into a sysfs tree, on a simulated clock.

    The thermal zone is written where profiles name it: ``/sys/class/thermal/`` (the Pi's) and the
    ``/sys/devices/virtual/thermal/`` folder a board's kernel links it to (the Jetson's)."""

    def __init__(self, root: Path, steps: List[Dict[str, Any]]) -> None:
        self.root, self.steps, self.now = root, steps, 0.0
        self.zones = [root / "sys/class/thermal/thermal_zone0", root / "sys/devices/virtual/thermal/thermal_zone0"]
        self.battery = root / "sys/class/power_supply/battery"
        for folder, kind in [(zone, "cpu-thermal") for zone in self.zones] + [(self.battery, "Battery")]:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "type").write_text(kind + "\n")

    def clock(self) -> float:
        return self.now

    def apply(self, step: Dict[str, Any]) -> None:
        for zone in self.zones:
            (zone / "temp").write_text(f"{int(step['temp_c'] * 1000)}\n")
        (self.battery / "capacity").write_text(f"{int(step['battery_pct'])}\n")
        (self.battery / "status").write_text(step.get("status", "Discharging") + "\n")


@dataclass
class HeadStats:
    """One head count's results in bounded memory: counts of every image, the latest latencies only."""

    images: int = 0
    labelled: int = 0
    correct: int = 0
    latency_ms: Deque[float] = field(default_factory=lambda: deque(maxlen=Stats.WINDOW))


@dataclass
class Stats:
    """Per head count: latency and live accuracy of what actually ran, in memory and time per image that do
    not grow with the images served (a board serves for weeks): images and live top-1 are counts over
    every image, the median latency is of the head count's latest ``WINDOW`` images."""

    WINDOW = 1024  # latencies kept per head count: a median over seconds to minutes of recent service
    heads: Dict[int, HeadStats] = field(default_factory=dict)

    def add(self, heads: int, ms: float, correct: Optional[bool]) -> None:
        s = self.heads.setdefault(heads, HeadStats())
        s.images += 1
        s.latency_ms.append(ms)
        if correct is not None:
            s.labelled, s.correct = s.labelled + 1, s.correct + correct

    def live_top1(self) -> Optional[float]:
        """Live top-1 over every labelled image served so far, whichever head count ran it; None without labels."""
        labelled = sum(s.labelled for s in self.heads.values())
        return 100.0 * sum(s.correct for s in self.heads.values()) / labelled if labelled else None

    def summary(self, heads: int) -> Dict[str, Any]:
        s = self.heads.get(heads, HeadStats())
        return {"images": s.images, "median_ms": statistics.median(s.latency_ms) if s.latency_ms else None,
                "live_top1": 100.0 * s.correct / s.labelled if s.labelled else None}


class Display:
    """What a person watches: a live table when stdout is a terminal (rich), plain lines otherwise."""

    def __init__(self, plain: bool) -> None:
        self.live = None
        if not plain and sys.stdout.isatty():
            from rich.live import Live

            self.live = Live(refresh_per_second=8)
            self.live.start()

    def status(self, row: Dict[str, Any]) -> None:
        if self.live is None:
            return
        from rich.table import Table

        table = Table(title="hydra-edge board demo")
        for key in row:
            table.add_column(rich_shown(key), justify="right")  # a scenario step's keys come from its file
        table.add_row(*(rich_shown(v) for v in row.values()))  # a class name is text, never rich markup
        self.live.update(table)

    def line(self, text: str) -> None:
        """One line of the app's output, ``shown``: names in it (classes, sensors, files) can neither
        drive the terminal nor break the line."""
        if self.live is not None:
            self.live.console.print(rich_shown(text))
        else:
            print(shown(text), flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def state_text(battery_pct: float, charging: bool, thermal: float) -> str:
    """The table's inputs as a person reads them: what a switch for the device's state was made on."""
    battery = "unknown" if math.isnan(battery_pct) else "n/a" if battery_pct < 0 else f"{battery_pct:.0f}%"
    return f"battery {battery}" + (" charging" if charging else "") + f", thermal {thermal:.1f}"


def page_reason(event: SwitchEvent) -> str:
    """A switch's reason on the page: one made for the device's state also says which state it was."""
    r = event.reading
    return f"{event.reason} ({state_text(r.battery_pct, r.charging, r.thermal)})" \
        if event.reason.startswith("state") and r is not None else event.reason


def describe(event: Dict[str, Any], accuracy: Dict[int, Optional[float]], stats: Stats) -> str:
    reading = event["reading"] or {}
    state = state_text(reading.get("battery_pct", -1), bool(reading.get("charging")),
                       reading.get("thermal", float("nan")))
    was = stats.summary(event["from"]) if event["from"] is not None else {}
    bought = f"{accuracy.get(event['to']) or float('nan'):.1f}% held-out top-1"
    after = f" (ran {event['from']} heads at {was['median_ms']:.2f} ms)" if was.get("median_ms") else ""
    return f"switch {event['from']} -> {event['to']} heads [{event['reason']}] at {state}: {bought}{after}"


class Summary:
    """The ``--plain`` line every ``every_s`` seconds of ``clock`` (the host's, from the app's start, also
    while a scripted day plays), and once more at the end: what was served since the start, with the
    running head count's latency over its latest ``Stats.WINDOW`` images (the inferences alone: the model
    loads are in the rate, never in p50/p90) and the live top-1 so far where images are labelled."""

    def __init__(self, every_s: float, clock: Any, stats: Stats) -> None:
        self.every_s, self.clock, self.stats = every_s, clock, stats
        self.due = clock() + every_s
        self.images, self.heads, self.switches, self.predicted = 0, 0, 0, ""

    def after(self, images: int, heads: int, switches: int, predicted: str) -> Optional[str]:
        """Note one more image; the summary when one is due, else None (a comparison per image)."""
        self.images, self.heads, self.switches, self.predicted = images, heads, switches, predicted
        return self.line() if self.clock() >= self.due else None

    def line(self) -> str:
        """The summary line now; the next is due ``every_s`` after it."""
        now = self.clock()
        self.due = now + self.every_s
        recent = sorted(self.stats.heads[self.heads].latency_ms)
        rate = f"{self.images / now:.1f}/s" if now > 0 else "-"
        top1 = self.stats.live_top1()
        live = "" if top1 is None else f"live top-1 {top1:.1f}%, "
        return (f"{now:.0f} s: {self.images} images ({rate}), {self.heads} heads, "
                f"p50 {percentile(recent, 50):.2f} ms, p90 {percentile(recent, 90):.2f} ms, "
                f"{live}{self.switches} switches, last {self.predicted}")


def since_start() -> Callable[[], float]:
    """A monotonic clock reading 0 when called: the board app's times are seconds since it started."""
    start = time.monotonic()
    return lambda: time.monotonic() - start


def latency_columns(switcher: Switcher) -> Dict[str, str]:
    """The latency loop's budget now and the running head count's windowed p90, for the status row."""
    status = switcher.latency_status()
    if status is None or switcher.heads is None:
        return {}
    p90 = status["p90_ms"].get(switcher.heads)
    return {"p90 ms": "-" if p90 is None else f"{p90:.2f}", "budget ms": f"{status['budget_ms']:.2f}"}


class PageFeed:
    """What ``--serve``'s live page shows: the inference loop records each result, the page's ticker
    takes a snapshot (twice a second, whatever the number of viewers); one lock between the two,
    held for the time of a few appends, so viewers cannot slow inference.

    The chart has one point per ``CHART_STEP_S`` of the app's clock (and one more wherever the head
    count changes): the p90 of that step's inferences, so ``CHART_POINTS`` points span minutes of
    service, or the scripted day's steps, however many images a second run. The p50 and p90 shown
    are of the last ``RECENT`` inferences of the head count running.
    """

    CHART_STEP_S = 1.0
    CHART_POINTS = 120
    RECENT = 120
    STEP_SAMPLES = 256  # timings kept for one chart point's p90: bounded whatever the inference rate

    def __init__(self, switcher: Switcher, accuracy: Dict[int, Optional[float]], clock: Any) -> None:
        self.switcher, self.accuracy, self.clock = switcher, accuracy, clock
        self.lock = threading.Lock()
        self.history: deque = deque(maxlen=self.CHART_POINTS - 1)  # closed chart Points, the oldest first
        self.step: Optional[Tuple[float, int, List[float]]] = None  # the open point: (t, heads, timings)
        self.recent: deque = deque(maxlen=self.RECENT)  # (heads, ms) of the latest inferences
        self.images, self.predicted = 0, None  # type: int, Optional[str]

    def record(self, heads: int, ms: float, predicted: str) -> None:
        now = self.clock()
        with self.lock:
            if self.step is not None and self.step[1] == heads and now - self.step[0] < self.CHART_STEP_S:
                if len(self.step[2]) < self.STEP_SAMPLES:
                    self.step[2].append(ms)
            else:
                if self.step is not None:
                    self.history.append(self._point(self.step))
                self.step = (now, heads, [ms])
            self.recent.append((heads, ms))
            self.images, self.predicted = self.images + 1, predicted

    @staticmethod
    def _point(step: Tuple[float, int, List[float]]) -> Point:
        return Point(t=step[0], heads=step[1], latency_ms=percentile(sorted(step[2]), 90))

    def snapshot(self) -> PageState:
        with self.lock:
            history = [*self.history, *([self._point(self.step)] if self.step else [])]
            images, predicted, recent = self.images, self.predicted, list(self.recent)
        heads = self.switcher.heads or (history[-1].heads if history else 0)
        running = sorted(ms for h, ms in recent if h == heads)
        status = self.switcher.latency_status() or {}
        reading = self.switcher.reading
        known = lambda v: v if v is not None and math.isfinite(v) and v >= 0 else None  # noqa: E731
        mains = reading is not None and reading.battery_pct < 0  # -1: the profile names no battery; NaN: unknown
        battery_assumed = reading is not None and math.isnan(reading.battery_pct)  # the lowest band, not mains
        switches = [Switch(t=e.time, from_heads=e.from_heads, to_heads=e.to_heads, reason=page_reason(e))
                    for e in self.switcher.events[-20:]]  # the last few only: a board runs for months
        return PageState(
            heads=heads, t=self.clock(), budget_ms=status.get("budget_ms"),
            planned_budget_ms=status.get("planned_budget_ms"),
            p50_ms=percentile(running, 50) if running else None, p90_ms=percentile(running, 90) if running else None,
            temp_c=known(reading.thermal) if reading else None,
            thermal_assumed=reading is not None and math.isnan(reading.thermal),
            battery_pct=known(reading.battery_pct) if reading else None, battery_assumed=battery_assumed,
            charging=reading.charging if reading and not (mains or battery_assumed) else None, mains=mains,
            notes=list(self.switcher.notes),
            top1=self.accuracy.get(heads), images=images,
            predicted=predicted, switches=switches, history=history)


def read_scenario(path: Path) -> List[Dict[str, Any]]:
    """The steps of a scenario file, each checked for what ``SimulatedBoard.apply`` needs."""
    steps = read_json(path, "scenario", "write one as {\"steps\": [...]}").get("steps")
    if not isinstance(steps, list) or not steps:
        raise HydraEdgeError(f"{path} has no \"steps\" list; see hydra-edge demo's scenario.json for the format")
    for i, step in enumerate(steps, 1):
        if not isinstance(step, dict) or not {"temp_c", "battery_pct"} <= set(step):
            raise HydraEdgeError(f"{path}: step {i} needs temp_c and battery_pct (and may set seconds, status, images)")
    return steps


def run(args: argparse.Namespace) -> Dict[str, Any]:
    bundle = Path(args.bundle)
    manifest = read_manifest(bundle)
    check_runtimes(runtimes_of(manifest.artefacts))  # one line now, not a fallback per artefact
    model = manifest.model
    scenario = read_scenario(Path(args.scenario)) if args.scenario else None
    board = SimulatedBoard(Path(args.sysfs_root), scenario) if scenario else None
    clock = board.clock if board else since_start()  # the switches' and the page's times, from the start
    switcher = Switcher(bundle, lut=args.lut, root=args.sysfs_root or "/", poll_s=args.poll_s, threads=args.threads,
                        clock=clock,
                        latency_loop=LoopSettings(budget_ms=args.budget_ms, window_s=args.loop_window_s,
                                                  sustain_s=args.loop_sustain_s, dwell_s=args.loop_dwell_s))
    # The held-out accuracy of the artefact each head count runs (a bundle may hold several per head count).
    records = manifest.by_id()
    accuracy = {c.heads: (records[c.artefact].accuracy or {}).get("top1") if c.artefact in records else None
                for c in switcher.table.candidates}
    if args.camera is not None:
        samples: Iterator[Sample] = camera_images(args.camera, model["img_size"], model["in_chans"])
    else:
        samples = itertools.cycle(folder_images(Path(args.images), model["img_size"], model["in_chans"],
                                                manifest.classes))
    steps = scenario or [{"images": args.max_images or 10**12}]
    feed = PageFeed(switcher, accuracy, clock)
    page = LivePage(feed.snapshot, *parse_address(args.serve), allow_remote=args.serve_remote) if args.serve else None
    display, stats, shown, count, step_now = Display(args.plain), Stats(), 0, 0, {}
    summary = Summary(args.summary_s, since_start(), stats)  # the host's seconds, on a scripted day too

    def classify(image: np.ndarray, label: Optional[int]) -> None:
        """Run one image; show the switches it caused (each with its reason) and the status."""
        nonlocal shown, count
        prediction = switcher.predict(image)
        ms = prediction.ms  # the inference alone: the first image's model load would pass for seconds of latency
        predicted, count = int(prediction.logits.argmax()), count + 1
        stats.add(prediction.heads, ms, None if label is None else predicted == label)
        events, shown = switcher.events_since(shown)  # the new switches only: constant work per image
        for event in events:
            display.line(describe(event_record(event), accuracy, stats))
        name = class_name(predicted, manifest.classes)
        feed.record(prediction.heads, ms, name)
        if display.live is None:
            if args.each_image and not board:
                labelled = "" if label is None else f", labelled {class_name(label, manifest.classes)}"
                display.line(f"image {count}: {name} ({prediction.heads} heads, {ms:.2f} ms{labelled})")
            line = summary.after(count, prediction.heads, switcher.switches, name)
            if line is not None:
                display.line(line)
        display.status({"class": name, "heads": prediction.heads, "latency ms": f"{ms:.2f}",
                        **latency_columns(switcher), "held-out top-1": accuracy.get(prediction.heads), **step_now})

    try:
        if page is not None:  # a port in use is one line here, before any inference
            display.line(f"{URL_LINE}{page.start()}")
        if not board:
            switcher.start()
        for step in steps:  # Ctrl-C or SIGTERM ends the run; the summary and the log below still follow
            images = int(step.get("images", 20))
            if board:
                board.apply(step)
                step_now = step  # shown in the status row
                polls = max(1, round(float(step.get("seconds", 10)) / args.poll_s))
                for i in range(polls):  # poll as a board does: more heads need a reading that persists
                    board.now += args.poll_s
                    switcher.poll()
                    for image, label in itertools.islice(samples, images * (i + 1) // polls - images * i // polls):
                        classify(image, label)
            else:
                for image, label in itertools.islice(samples, images):
                    classify(image, label)
    except KeyboardInterrupt:
        display.line("stopped")
    finally:
        if display.live is None and summary.images:  # what was served, also when stopped
            display.line(summary.line())
        display.close()
        if page is not None:
            page.stop()
        switcher.close()
    report = {"events": switcher.event_log(), "switches": switcher.switches,
              "per_heads": {k: stats.summary(k) for k in sorted(stats.heads)},
              "fallback": switcher.fallback, "latency": switcher.latency_status()}
    if args.log:
        write_json(args.log, report)
    for k, s in report["per_heads"].items():
        live = "n/a" if s["live_top1"] is None else f"{s['live_top1']:.1f}%"
        print(f"{k:>3} heads: {s['images']} images, median {s['median_ms']:.2f} ms, live top-1 {live}", flush=True)
    return report


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", required=True, help="bundle folder with manifest.json, artefacts and lut.json")
    parser.add_argument("--lut", help="lookup table (default: the bundle's lut.json)")
    parser.add_argument("--images", help="folder of images (a sub-folder per class gives live accuracy)")
    parser.add_argument("--camera", type=number_arg(0, MAX_CAMERA, integer=True),
                        help="OpenCV camera index instead of --images")
    parser.add_argument("--max-images", type=number_arg(1, MAX_IMAGES, integer=True),
                        help="stop after this many images (default: run until Ctrl-C)")
    parser.add_argument("--scenario", help="JSON steps {seconds, battery_pct, status, temp_c, images} to replay")
    parser.add_argument("--sysfs-root", default=None, help="read (or with --scenario, write) signals under this root")
    parser.add_argument("--poll-s", type=number_arg(*POLL_S), default=1.0, help="seconds between signal reads")
    parser.add_argument("--threads", type=number_arg(1, MAX_THREADS, integer=True),
                        help="runtime threads (default: the target's, at most one per core)")
    parser.add_argument("--budget-ms", type=number_arg(0, MAX_BUDGET_MS, low_open=True),
                        help="latency budget the loop holds each head count's p90 to (default: the table's)")
    loop = LoopSettings()
    parser.add_argument("--loop-window-s", type=number_arg(0, MAX_LOOP_S, low_open=True), default=loop.window_s,
                        help="seconds of timings each head count's p90 is taken over")
    parser.add_argument("--loop-sustain-s", type=number_arg(0, MAX_LOOP_S, low_open=True), default=loop.sustain_s,
                        help="seconds the p90 must stay over budget before fewer heads run")
    parser.add_argument("--loop-dwell-s", type=number_arg(0, MAX_LOOP_S, low_open=True), default=loop.dwell_s,
                        help="seconds a larger head count must be predicted to fit before it is tried; with none "
                             "predicted, more heads are tried after 8 x this of the running count fitting")
    parser.add_argument("--plain", action="store_true", help="plain lines instead of the live table: each switch, "
                                                              "and a summary every --summary-s seconds")
    parser.add_argument("--summary-s", type=number_arg(0, MAX_LOOP_S, low_open=True), default=SUMMARY_S,
                        help="seconds between the plain output's summary lines")
    parser.add_argument("--each-image", action="store_true",
                        help="with plain output, also a line per image (hundreds a second on a fast board)")
    parser.add_argument("--serve", metavar="HOST:PORT",
                        help="serve a live page of the board's state here (read-only; e.g. 127.0.0.1:8765, "
                             "opened from another machine through ssh -L)")
    parser.add_argument("--serve-remote", action="store_true",
                        help="let --serve listen on an address that is not loopback (open to the network)")
    parser.add_argument("--log", help="write the switch events and per-head-count results as JSON here")
    parser.add_argument("--runtime-log", help="where what the runtimes themselves print goes "
                                              "(default: the bundle's logs/runtime.log)")
    args = parser.parse_args(argv)
    if (args.images is None) == (args.camera is None):
        parser.error("give exactly one of --images and --camera")
    if args.scenario and not args.sysfs_root:
        parser.error("--scenario needs --sysfs-root (a folder for the simulated sysfs tree)")
    runtime_log = Path(args.runtime_log or Path(args.bundle) / "logs" / "runtime.log")
    try:  # before logging keeps sys.stderr: the app's own warnings stay on the terminal
        native_output_to(runtime_log, "board demo app: what the runtimes printed")
    except OSError as e:
        print(shown(f"Error: cannot write the runtime log {runtime_log} ({e.strerror}); pass --runtime-log PATH"),
              file=sys.stderr)
        return 1
    handler = logging.StreamHandler()
    handler.setFormatter(ShownFormatter("%(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    # SIGTERM (systemd's stop, kill) ends the run as Ctrl-C does, summary and --log kept; once stopping,
    # a second signal (Ctrl-C reaching the app and the demo that forwards its stop) cannot cut them short
    stop_on_signals(once=True)
    try:
        run(args)
    except KeyboardInterrupt:  # before the first image: nothing to sum up
        print("stopped", flush=True)
        return 130
    except HydraEdgeError as e:
        print(f"Error: {shown(e)}", file=sys.stderr)
        return 1
    finally:
        print(f"runtime output: {shown(runtime_log)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
