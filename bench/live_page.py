"""What the live page costs the board: the real board app's inference throughput with 0 to MAX_STREAMS watchers.

Converts a preset model (random weights, ONNX fp32, 3/6/12 heads) for a board profile with the
scripted day's sysfs paths, calibrates this machine as the device (``hydra-edge calibrate --local``)
and builds its table (the budget: the largest head count's latency + 10 %, as ``hydra-edge demo``).

(a) The bound. The board app (``apps/board-demo/app.py --serve``) classifies without pause on a cool,
charging simulated board, pinned to one core with one engine thread; its latency loop is given a
budget no inference misses, so the head count stays the table's choice and only the clients change.
The clients run in this process on the other cores: each condition (0, 1, 8 and ``MAX_STREAMS``
``/events`` streams, and ``MAX_STREAMS`` streams plus threads fetching ``/state.json`` as fast as
they can) holds for ``--window-s`` seconds, the conditions interleaved round after round. Throughput
is the app's own count: ``images`` over ``t`` between two of its ``/state.json`` ticks. Reported per
condition: the median images/s, and the median over rounds of its ratio to that round's 0-client
window.

(b) A screenshot. The same app replays ``hydra-edge demo``'s scripted day (``--scenario``, the
demo's latency budget) while headless Chromium watches its page, captured ``--at-s`` into the day.

(c) Attacks (issue 37, items 10 and 11), ``--only attacks``: the same app as in (a) while a client in a
process of its own (tests/support/page_attack.py) attacks the page for ``--attack-s`` seconds: a slowloris (200
sockets opened at once, each sending one header line a second, never a whole head) or a flood (50 threads
fetching ``/`` back to back), and, for reference, no attack. Meanwhile a legitimate viewer in this process
polls ``/state.json`` every 0.5 s with a 2 s timeout: its latency p50/p90/max (an unanswered poll counted
as infinitely slow) and answered/unanswered; and the app's images/s and other threads' share of its core
over the attack. ``--app-root`` runs the app of another checkout (the code before a change) and
``--label`` names the run: runs with different labels sit side by side in live_page_attacks.json/.md.

Writes live_page.json, live_page.md and live_page.png (the screenshot); (c) writes live_page_attacks.json
and live_page_attacks.md.

    .venv/bin/python bench/live_page.py --preset mini --rounds 5 --window-s 5
    .venv/bin/python bench/live_page.py --only attacks --attack-s 20 --label after
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np
from PIL import Image
from switch_latency import calibrate_here

from hydra_edge.atomic import write_bytes, write_json, write_text
from hydra_edge.commands.demo import demo_budget, loop_budget, scenario_steps
from hydra_edge.commands.deploy import APP
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.convert.pipeline import convert
from hydra_edge.lut.make import make_lut
from hydra_edge.model.config import parse_heads, preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.profiling.timing import host_cpu
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.live_page import MAX_REQUESTS_PER_S, MAX_STREAMS, REQUEST_BURST

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' support package (tests/support) is not installed: import it from there
from support.browser import Chromium  # noqa: E402  (the tests' DevTools driver)
from support.page_attack import attack, attack_result, summary, viewer  # noqa: E402  (the attacker, in its own process)
from support.processes import free_port  # noqa: E402

# ONNX fp32 on onnxruntime, read from the sysfs paths the app's SimulatedBoard writes (a Pi's, plus a battery).
PROFILE = """\
name = "board-onnx"
threads = 1
[[artefacts]]
format = "onnx"
quant = "fp32"
runtime = "onnxruntime"
runtime_min_version = "1.17"
[signals.files]
temperature_mC = "/sys/class/thermal/thermal_zone0/temp"
battery_capacity = "/sys/class/power_supply/battery/capacity"
"""
NO_MISS_MS = 60_000.0  # the loop's budget in (a): the head count must not change with the clients
STREAM_COUNTS = (0, 1, 8, MAX_STREAMS)
POLLERS = 4  # threads fetching /state.json back to back, beside MAX_STREAMS streams
TICKS_PER_S = os.sysconf("SC_CLK_TCK")  # /proc's CPU time unit


def bundle_here(work: Path, preset_name: str, heads: str, eval_images: int) -> Path:
    """The preset with random weights converted for ``PROFILE`` (reused when it is there and unchanged)."""
    work.mkdir(parents=True, exist_ok=True)
    checkpoint, profile = work / f"{preset_name}_random.pt", work / "board-onnx.toml"
    if not checkpoint.is_file():
        HydraViT(preset(preset_name)).save(checkpoint)  # no data spec: verified on random inputs
    write_text(profile, PROFILE)
    out = work / f"{preset_name}_board-onnx_h{heads.replace(',', '-')}"
    result = convert(ConvertOptions(checkpoint=checkpoint, target=str(profile), out=out, heads=heads,
                                    eval_limit=eval_images, layout="full"), lambda *a: None)
    if result.failed:
        raise SystemExit(f"conversion failed: {result.failed[0]}")
    return out


def board_ready(work: Path, preset_name: str, heads: str, eval_images: int,
                runs: int) -> Tuple[Path, Path, float, Path]:
    """What the board app needs, made here as ``hydra-edge demo`` makes it: the bundle, this machine's
    calibration, the table for a budget of the largest head count's latency + 10 %, and images.
    Returns (bundle, calibration, budget in ms, images folder)."""
    heads = ",".join(map(str, parse_heads(heads, preset(preset_name).num_heads)))
    bundle = bundle_here(work, preset_name, heads, eval_images)
    calibration = calibrate_here(bundle, runs, 1, work)
    budget = demo_budget(bundle, calibration)
    make_lut(bundle, calibration, bundle, budget_ms=budget)
    model = read_manifest(bundle).model
    return bundle, calibration, budget, random_images(work / "images", model["img_size"], model["in_chans"])


def random_images(folder: Path, size: int, channels: int, n: int = 16) -> Path:
    """Unlabelled random images: the model has random weights, only the timing matters."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        pixels = rng.integers(0, 255, (size, size, channels) if channels == 3 else (size, size), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:02d}.png")
    return folder


class App:
    """The board app in its own process, pinned to ``cores``, serving its page on a free loopback port."""

    def __init__(self, args: List[str], cores: Set[int], log: Path, root: Path = ROOT) -> None:
        for learned in log.parent.glob("**/lut.correction.json"):
            learned.unlink()  # a fresh board: no latency learned by an earlier run caps it
        self.port = free_port()
        self.log = log.open("w")
        self.process = subprocess.Popen(  # root: this checkout, or another one's app and package (--app-root)
            [sys.executable, str(root / APP.relative_to(ROOT)), *args, "--threads", "1", "--plain",
             "--serve", f"127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.sched_setaffinity(0, cores),
            env={**os.environ, "PYTHONPATH": str(root)})

    def state(self) -> Dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/state.json")
            return json.loads(conn.getresponse().read())["state"] or {}
        finally:
            conn.close()

    def wait(self, done: Callable[[Dict[str, Any]], bool], within_s: float, what: str) -> Dict[str, Any]:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the app exited ({self.process.returncode}) before {what}; see {self.log.name}")
            try:
                state = self.state()
                if state and done(state):
                    return state
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"the app did not reach {what} within {within_s:g} s; see {self.log.name}")

    def cpu_s(self) -> Tuple[float, float]:
        """CPU seconds of the whole app (its ended threads included) and of its main (inference) thread."""
        def used(stat: Path) -> float:
            fields = stat.read_text().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / TICKS_PER_S  # utime + stime

        proc = Path(f"/proc/{self.process.pid}")
        return used(proc / "stat"), used(proc / "task" / str(self.process.pid) / "stat")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class Clients:
    """``streams`` /events readers and ``pollers`` /state.json fetchers on threads, until ``stop()``."""

    def __init__(self, port: int, streams: int, pollers: int) -> None:
        self.port, self.done, self.start = port, threading.Event(), time.monotonic()
        self.ticks, self.fetches, self.refused = 0, 0, 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._stream, daemon=True) for _ in range(streams)]
        self.threads += [threading.Thread(target=self._poll, daemon=True) for _ in range(pollers)]
        for t in self.threads:
            t.start()

    def _count(self, name: str) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + 1)

    def _stream(self) -> None:
        while True:  # a slot the last condition's stream held is freed at the server's next write: retry
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            conn.request("GET", "/events")
            reply = conn.getresponse()
            if reply.status == 200:
                break
            conn.close()
            self._count("refused")
            if self.done.wait(0.5):
                return
        while not self.done.is_set():
            line = reply.readline()
            if not line:
                return
            if line.startswith(b"data: "):
                self._count("ticks")
        conn.close()

    def _poll(self) -> None:
        while not self.done.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                conn.request("GET", "/state.json")
                conn.getresponse().read()
                self._count("fetches")
            except OSError:
                self._count("refused")
            finally:
                conn.close()

    def stop(self) -> float:
        """Stop every client; the fetches a second they made."""
        self.done.set()
        seconds = time.monotonic() - self.start
        for t in self.threads:
            t.join(15)
        time.sleep(1.5)  # the server sees the streams gone at its next writes: their slots are free again
        return self.fetches / seconds


def window(app: App, seconds: float) -> Tuple[float, float]:
    """Over about ``seconds``: the images a second the app classified (its own ``images`` and clock ``t``),
    and the share of a core its threads other than inference used (the page's server, streams and
    ticker, and the switcher's signal polls)."""
    first, (total0, main0), wall0 = app.state(), app.cpu_s(), time.monotonic()
    time.sleep(seconds)
    last, (total1, main1), wall1 = app.state(), app.cpu_s(), time.monotonic()
    return ((last["images"] - first["images"]) / (last["t"] - first["t"]),
            ((total1 - total0) - (main1 - main0)) / (wall1 - wall0))


def bound(args: argparse.Namespace, bundle: Path, images: Path, sysfs: Path, app_cores: Set[int],
          client_cores: Set[int]) -> Dict[str, Any]:
    """(a): images/s per condition, interleaved over ``args.rounds`` rounds."""
    conditions = [(n, 0) for n in STREAM_COUNTS] + [(MAX_STREAMS, POLLERS)]
    app = App(["--bundle", str(bundle), "--images", str(images), "--sysfs-root", str(sysfs),
               "--budget-ms", str(NO_MISS_MS)], app_cores, Path(args.work) / "app-bound.log")
    os.sched_setaffinity(0, client_cores)
    rows: Dict[str, List[Dict[str, Any]]] = {f"{n}+{p}": [] for n, p in conditions}
    try:
        start = app.wait(lambda s: s["images"] >= 50, 120, "its first 50 images")
        heads = start["heads"]
        time.sleep(args.warmup_s)
        for r in range(args.rounds):
            order = conditions[r % len(conditions):] + conditions[:r % len(conditions)]  # each first once in a while
            for streams, pollers in order:
                clients = Clients(app.port, streams, pollers)
                time.sleep(1.0)  # connected and streaming
                rate, others = window(app, args.window_s)
                fetch_rate = clients.stop()
                rows[f"{streams}+{pollers}"].append({"round": r, "images_per_s": round(rate, 2),
                                                     "other_threads_core_share": round(others, 4),
                                                     "ticks": clients.ticks, "fetches_per_s": round(fetch_rate, 1),
                                                     "refused": clients.refused})
                print(f"round {r}: {streams:>2} streams + {pollers} pollers: {rate:.1f} images/s, "
                      f"other threads {100 * others:.2f} % of the core "
                      f"({clients.ticks} ticks, {clients.fetches} fetches, {clients.refused} refused)", flush=True)
        end = app.state()
    finally:
        app.stop()
    if end["heads"] != heads:
        raise SystemExit(f"the head count changed ({heads} -> {end['heads']}): the conditions are not comparable")
    idle = [r["images_per_s"] for r in rows["0+0"]]
    summary = []
    for streams, pollers in conditions:
        rates = [r["images_per_s"] for r in rows[f"{streams}+{pollers}"]]
        ratios = [rate / base for rate, base in zip(rates, idle)]
        summary.append({"streams": streams, "pollers": pollers,
                        "median_images_per_s": round(statistics.median(rates), 2),
                        "median_ratio_to_idle": round(statistics.median(ratios), 4),
                        "worst_ratio_to_idle": round(min(ratios), 4),
                        "median_other_threads_core_share": round(statistics.median(
                            r["other_threads_core_share"] for r in rows[f"{streams}+{pollers}"]), 4),
                        "fetches_per_s": statistics.median(r["fetches_per_s"] for r in rows[f"{streams}+{pollers}"]),
                        "refused": sum(r["refused"] for r in rows[f"{streams}+{pollers}"])})
    return {"heads": heads, "windows": rows, "summary": summary}


ATTACKS = (("none", 0), ("slowloris", 200), ("flood", 50))  # (kind, sockets or threads)


def attacks(args: argparse.Namespace, bundle: Path, images: Path, sysfs: Path, app_cores: Set[int],
            client_cores: Set[int]) -> Dict[str, Any]:
    """(c): per attack, the viewer's latency and the app's images/s and other threads' core share over it."""
    app = App(["--bundle", str(bundle), "--images", str(images), "--sysfs-root", str(sysfs),
               "--budget-ms", str(NO_MISS_MS)], app_cores, Path(args.work) / f"app-attacks-{args.label}.log",
              Path(args.app_root).resolve())
    os.sched_setaffinity(0, client_cores)  # the attacker process inherits it
    rows, load_before = [], os.getloadavg()[0]  # other work on a shared host moves images/s and the core shares
    try:
        app.wait(lambda s: s["images"] >= 50, 120, "its first 50 images")
        time.sleep(args.warmup_s)
        for kind, size in ATTACKS:
            time.sleep(3.0)  # the last attack's sockets are gone, the app's page idle again
            first, (total0, main0), wall0 = app.state(), app.cpu_s(), time.monotonic()
            attacker = attack(kind, "127.0.0.1", app.port, args.attack_s, size) if size else None
            time.sleep(1.0)  # under way: every socket opened, every thread fetching
            latencies = viewer("127.0.0.1", app.port, int((args.attack_s - 2) / 0.5), period_s=0.5, timeout=2.0)
            counts = attack_result(attacker, args.attack_s + 60) if attacker else {}
            if not attacker:
                time.sleep(max(0.0, wall0 + args.attack_s - time.monotonic()))
            total1, main1 = app.cpu_s()
            last = app.wait(lambda s: True, 30, "its state after the attack")
            wall1 = time.monotonic()
            row = {"attack": kind, "size": size, "viewer": summary(latencies),
                   "latencies_s": [None if t is None else round(t, 4) for t in latencies], "attacker": counts,
                   "images_per_s": round((last["images"] - first["images"]) / (last["t"] - first["t"]), 2),
                   "other_threads_core_share": round(((total1 - total0) - (main1 - main0)) / (wall1 - wall0), 4)}
            rows.append(row)
            v = row["viewer"]
            print(f"{args.label}: {kind}: viewer p50 {v['p50_s']} p90 {v['p90_s']} max {v['max_s']} s, "
                  f"{v['answered']}/{v['polls']} answered; {row['images_per_s']} images/s, other threads "
                  f"{100 * row['other_threads_core_share']:.2f} % of the core; attacker {counts}", flush=True)
    finally:
        app.stop()
    return {"app_root": str(Path(args.app_root).resolve()), "attack_s": args.attack_s, "rows": rows,
            "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def attacks_markdown(runs: Dict[str, Any], header: Dict[str, Any]) -> str:
    def seconds(value: Optional[float]) -> str:
        return "unanswered" if value is None else f"{value:.3f}"

    lines = []
    for label, run in runs.items():
        idle = run["rows"][0]["images_per_s"]
        for row in run["rows"]:
            v = row["viewer"]
            lines.append(f"| {label} | {row['attack']} | {v['answered']}/{v['polls']} | {seconds(v['p50_s'])} | "
                         f"{seconds(v['p90_s'])} | {seconds(v['max_s'])} | {row['images_per_s']:.1f} | "
                         f"{row['images_per_s'] / idle:.3f} | {100 * row['other_threads_core_share']:.2f} |")
    return (f"# The live page under attack: {header['model']}, ONNX fp32\n\n"
            f"Host: {header['host']}. The board app pinned to core {header['app_cores']} with one engine thread; "
            f"the attacker (its own process) and the viewer on core {header['client_cores']}. Each attack "
            "lasts its run's attack seconds; slowloris: 200 sockets opened at once, one header line a second "
            "each, never a whole head; flood: 50 threads fetching / back to back. The viewer polls /state.json "
            "every 0.5 s with a 2 s timeout from 1 s into the attack; an unanswered poll counts as infinitely "
            "slow in the percentiles. images/s by the app's own count over the attack; other threads: the "
            "app's CPU time less its inference thread's, as a share of one core.\n\n"
            "| code | attack | viewer answered | p50 s | p90 s | max s | images/s | x no attack | "
            "other threads % of the core |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
            + "\n".join(lines) + "\n\n" + "".join(f"- {label}: app from {run['app_root']}, attacks of "
                                                   f"{run['attack_s']:g} s{load(run)}\n" for label, run in runs.items()))


def load(run: Dict[str, Any]) -> str:
    """The host's 1-minute load average at a run's start and end, where it was recorded."""
    if "load_avg_1m" not in run:
        return ""
    start, end = run["load_avg_1m"]
    return f"; 1-min load average {start:.2f} at its start, {end:.2f} at its end"


def screenshot(args: argparse.Namespace, bundle: Path, budget_ms: float, images: Path, app_cores: Set[int],
               client_cores: Set[int]) -> Dict[str, Any]:
    """(b): the page of the app replaying the demo's day, captured ``args.at_s`` (simulated) seconds into it."""
    work = Path(args.work)
    scenario = work / "scenario.json"
    write_json(scenario, {"steps": scenario_steps(args.images_per_step)})
    app = App(["--bundle", str(bundle), "--images", str(images), "--scenario", str(scenario),
               "--sysfs-root", str(work / "day-sysfs"), "--budget-ms", str(budget_ms)], app_cores, work / "app-day.log")
    browser: Optional[Chromium] = None
    try:
        app.wait(lambda s: s["images"] > 0, 120, "its first image")
        os.sched_setaffinity(0, client_cores)  # the browser inherits it
        browser = Chromium(f"http://127.0.0.1:{app.port}/", size="1100,760")
        state = app.wait(lambda s: s["t"] >= args.at_s, 600, f"{args.at_s:g} s into the day")
        time.sleep(1.0)  # a tick or two: the browser has drawn that state
        png = browser.screenshot()
        shown = {"heads": browser.text("heads"), "switches": browser.text("switches")}
    finally:
        if browser is not None:
            browser.close()
        app.stop()
    write_bytes(Path(args.out) / "live_page.png", png)
    return {"images_per_step": args.images_per_step, "at_s": state["t"],
            "switches": [f"{s['from_heads']} -> {s['to_heads']}: {s['reason']}" for s in state["switches"]],
            "browser_showed": shown}


def markdown(report: Dict[str, Any]) -> str:
    summary = report["summary"]
    rows = "".join(f"| {s['streams']} | {s['pollers']} | {s['fetches_per_s']:.0f} | {s['median_images_per_s']:.1f} | "
                   f"{s['median_ratio_to_idle']:.3f} | {s['worst_ratio_to_idle']:.3f} | "
                   f"{100 * s['median_other_threads_core_share']:.2f} |\n" for s in summary)
    idle = [w["images_per_s"] for w in report["windows"]["0+0"]]
    spread = 100 * (max(idle) - min(idle)) / statistics.median(idle)
    share = max(s["median_other_threads_core_share"] for s in summary)
    quiet = summary[0]["median_other_threads_core_share"]
    kept = min(s["median_ratio_to_idle"] for s in summary)
    flood = summary[-1]
    return (f"# The live page's cost to inference: {report['model']}, {report['heads']} heads, ONNX fp32\n\n"
            f"Host: {report['host']}. The board app pinned to core {report['app_cores']} with one engine thread; "
            f"the clients in this bench's process on core {report['client_cores']}. {report['rounds']} rounds, the "
            f"conditions interleaved, {report['window_s']:g} s each; images/s by the app's own count; other "
            "threads: the app's CPU time less its inference thread's (the page's server, streams and ticker, "
            "the switcher's signal polls), as a share of one core.\n\n"
            "| /events streams | /state.json pollers | fetches/s answered | images/s (median) | x 0 clients (median) "
            "| x 0 clients (worst round) | other threads % of the core (median) |\n"
            "|---:|---:|---:|---:|---:|---:|---:|\n" + rows +
            f"\nThe bound: with up to {MAX_STREAMS} streams (the most the page serves), and with {POLLERS} more "
            f"clients fetching /state.json back to back (answered {flood['fetches_per_s']:.0f} times a second: the "
            f"page accepts {MAX_REQUESTS_PER_S:g} requests a second beyond a burst of {REQUEST_BURST}), the app's "
            f"threads other than inference used at most {100 * share:.1f} % of the core ({100 * quiet:.2f} % with no "
            f"client), and inference kept {100 * kept:.1f} % or more of its 0-client rate (median over rounds; the "
            f"0-client windows alone spread {spread:.0f} % on this shared host).\n\n"
            f"Screenshot (live_page.png): the app replaying the demo's day, {report['day']['images_per_step']} "
            f"images a step, captured {report['day']['at_s']:.0f} s into the day (its simulated clock) with "
            f"{len(report['day']['switches'])} switches listed.\n")


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="mini", help="mini (milliseconds an inference) or b16 (the paper's model)")
    p.add_argument("--heads", default="3,6,12")
    p.add_argument("--runs", type=int, default=30, help="timed runs per artefact for the calibration")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the interleaved conditions")
    p.add_argument("--window-s", type=float, default=5.0, help="seconds each condition is timed")
    p.add_argument("--warmup-s", type=float, default=10.0, help="seconds the app runs before the first round")
    p.add_argument("--images-per-step", type=int, default=3000, help="images a step of the day in the screenshot")
    p.add_argument("--at-s", type=float, default=150.0,
                   help="the day's (simulated) second the screenshot is taken at: 150 s is its 6th step, "
                        "the chart's two minutes spanning the heat's switch")
    p.add_argument("--eval-images", type=int, default=8, help="random inputs each artefact is verified on")
    p.add_argument("--work", default=str(ROOT / "runs" / "bench-live-page"), help="checkpoint, bundle, app logs")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for live_page.*")
    p.add_argument("--only", choices=["bound", "attacks"], default="bound",
                   help="bound: (a) and (b), live_page.*; attacks: (c) only, live_page_attacks.*")
    p.add_argument("--attack-s", type=float, default=20.0, help="(c): seconds each attack lasts")
    p.add_argument("--app-root", default=str(ROOT), help="(c): the checkout whose board app and package run")
    p.add_argument("--label", default="this checkout", help="(c): the name of this run in live_page_attacks.*")
    args = p.parse_args(argv)
    if min(args.runs, args.rounds, args.images_per_step) < 1 or min(args.window_s, args.warmup_s) <= 0:
        p.error("--runs, --rounds and --images-per-step must be >= 1, --window-s and --warmup-s > 0")
    if args.attack_s < 4:
        p.error("--attack-s must be >= 4: the viewer polls from 1 s into the attack until 1 s before its end")
    if not 0 < args.at_s < sum(step["seconds"] for step in scenario_steps(1)):
        p.error("--at-s must fall within the scripted day")
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        p.error("needs two cores: one for the app, one for its clients")
    app_cores, client_cores = {min(allowed)}, allowed - {min(allowed)}
    work = Path(args.work)
    bundle, calibration, budget, images = board_ready(work, args.preset, args.heads, args.eval_images, args.runs)
    sysfs = work / "cool-sysfs"  # on the charger, cool: the table's largest head count
    for path, text in (("sys/class/thermal/thermal_zone0/temp", "40000"),
                       ("sys/class/power_supply/battery/capacity", "100"),
                       ("sys/class/power_supply/battery/status", "Charging")):
        write_text(sysfs / path, text + "\n")
    report: Dict[str, Any] = {"model": f"{args.preset} preset, random weights", "host": host_cpu(),
                              "app_cores": sorted(app_cores), "client_cores": sorted(client_cores),
                              "rounds": args.rounds, "window_s": args.window_s, "pollers": POLLERS}
    if args.only == "attacks":
        out, header = Path(args.out), {k: report[k] for k in ("model", "host", "app_cores", "client_cores")}
        path = out / "live_page_attacks.json"
        runs = json.loads(path.read_text())["runs"] if path.is_file() else {}
        runs[args.label] = attacks(args, bundle, images, sysfs, app_cores, client_cores)
        write_json(path, {**header, "runs": runs})
        write_text(out / "live_page_attacks.md", attacks_markdown(runs, header))
        print(attacks_markdown(runs, header))
        return
    report.update(bound(args, bundle, images, sysfs, app_cores, client_cores))
    report["day"] = screenshot(args, bundle, loop_budget(budget, calibration), images, app_cores, client_cores)
    out = Path(args.out)
    write_json(out / "live_page.json", report)
    write_text(out / "live_page.md", markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
