"""The board app on a real converted bundle under a real CPU-bound load, watched in a real browser.

One run of the app (``--serve``, the latency loop on, a day's battery and temperature written into
a simulated sysfs tree by the app's own ``SimulatedBoard``) shows what the latency loop and the
live page promise together: busy-looping processes pinned to the app's core make the table's
head count miss its budget, the app steps down until its p90 fits again, and after the load
stops it returns to the table's choice; headless Chromium on the app's page sees the head count
change, and the day's "very hot" step takes heads away as the table says.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Set

import numpy as np
import pytest
import torch
from support.browser import Chromium
from support.demo_board import digit_images, table_for, trained_accuracy
from support.processes import free_port
from support.targets import BOARD_TARGET

from hydra_edge.commands.demo import scenario_steps
from hydra_edge.commands.deploy import APP
from hydra_edge.convert import pipeline
from hydra_edge.convert.options import ConvertOptions
from hydra_edge.model.config import preset
from hydra_edge.model.hydravit import HydraViT
from hydra_edge.records.manifest import read_manifest
from hydra_edge.runtime.latency import percentile
from hydra_edge.runtime.switcher import Switcher

pytestmark = pytest.mark.slow  # converts a bundle, runs the app under load for ~15 s, starts a browser

ROOT = Path(__file__).resolve().parents[1]
BUSY = "while True: pass"
LOADS_PER_CORE = 2  # the app keeps a third of its core: a slow-down well clear of a shared host's noise
# The loop reacts faster than its defaults (5, 10 and 30 s) so the run takes seconds, not a minute.
WINDOW_S, SUSTAIN_S, DWELL_S = 2.0, 3.0, 4.0
# The stated times: the p90 is over budget once a tenth of the window is slow, and must stay over
# for SUSTAIN_S; back up once the window has forgotten the load and DWELL_S has passed, then a probe
# of 20 inferences. Each plus 3 s for the page's tick, this test's polling and a busy shared host.
DOWN_WITHIN_S = WINDOW_S + SUSTAIN_S + 3.0
BACK_WITHIN_S = WINDOW_S + DWELL_S + 3.0


def board_app() -> Any:
    """The board app as a module, for its ``SimulatedBoard`` (the sysfs tree its ``--scenario`` writes)."""
    spec = importlib.util.spec_from_file_location("board_app", APP)
    assert spec is not None and spec.loader is not None
    module = sys.modules["board_app"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wide_board(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """The digits model at ViT-B/16's widths (12 heads of 64), two blocks, 3 and 12 heads, converted.

    The smallest model whose inference (about 10 ms here) outlasts the scheduler's slice: a busy loop
    on the same core then slows most inferences. The digits preset's 0.1 ms inferences mostly run
    between two slices, so its p90 hardly moves under the same load.
    """
    root = tmp_path_factory.mktemp("wide")
    torch.manual_seed(0)
    HydraViT(preset("digits", depth=2, head_dim=64, heads=(3, 12))).save(root / "wide.pt")
    (root / "board.toml").write_text(BOARD_TARGET)
    pipeline.convert(ConvertOptions(checkpoint=root / "wide.pt", target=str(root / "board.toml"), out=root / "bundle",
                                    heads="3,12", data="digits", eval_limit=20, layout="full"))
    bundle = root / "bundle"
    trained_accuracy(bundle)
    return {"bundle": bundle, "lut": table_for(bundle, root), "images": digit_images(root / "images")}


@contextmanager
def pinned(cores: Set[int]) -> Iterator[None]:
    """This process on ``cores`` for the block (what it starts inherits them), then back as it was."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def start_load(cores: Set[int]) -> List[subprocess.Popen]:
    """``LOADS_PER_CORE`` busy-looping processes per core, each pinned to all of ``cores`` (where the app runs)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY], preexec_fn=lambda: os.sched_setaffinity(0, cores))
            for _ in range(LOADS_PER_CORE * len(cores))]


def stop(processes: List[subprocess.Popen]) -> None:
    """Kill each process by its PID and reap it."""
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.wait()


def p90_of_the_tables_choice(board: Dict[str, Path], sysfs: Path, cores: Set[int], load: bool) -> float:
    """The p90 of single-image inferences (ms) for 1.5 s of the table's choice, timed as the page times them,
    on ``cores``, with the load on them or not: what the test's budget is set between."""
    x = np.zeros((1, 8, 8), np.float32)
    busy: List[subprocess.Popen] = []
    with pinned(cores), Switcher(board["bundle"], lut=board["lut"], root=str(sysfs), threads=1) as switcher:
        try:
            for _ in range(10):  # the engine loaded and warm
                switcher.predict(x)
            busy = start_load(cores) if load else []
            timings, start = [], time.monotonic()
            while time.monotonic() - start < 1.5:
                t = time.perf_counter()
                switcher.predict(x)
                timings.append(1e3 * (time.perf_counter() - t))
        finally:
            stop(busy)
        assert switcher.heads == 12
    return percentile(sorted(timings), 90)


def page_state(port: int) -> Dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/state.json", timeout=5) as reply:
        return json.loads(reply.read())["state"] or {}


def wait_for(port: int, app: subprocess.Popen, done: Callable[[Dict[str, Any]], bool], within_s: float,
             what: str) -> Dict[str, Any]:
    """The app's first /state.json for which ``done`` holds, polled 5 times a second for ``within_s``."""
    deadline, state = time.monotonic() + within_s, {}
    while time.monotonic() < deadline:
        assert app.poll() is None, f"the app exited ({app.returncode}) while waiting for {what}"
        try:
            state = page_state(port)
        except OSError:
            state = {}
        if state and done(state):
            return state
        time.sleep(0.2)
    raise AssertionError(f"not within {within_s:g} s: {what}; the page's state: {state}")


def fits(state: Dict[str, Any]) -> bool:
    return state["p90_ms"] is not None and state["p90_ms"] <= state["budget_ms"]


def calm(state: Dict[str, Any], seconds: int) -> bool:
    """12 heads, and each of the chart's last ``seconds`` one-second p90s within budget: the loop's window
    holds no burst of the shared host's own load, so the first slow-down it sees is the test's."""
    points = state["history"][-seconds:]
    return (state["heads"] == 12 and len(points) == seconds
            and all(p["heads"] == 12 and p["latency_ms"] <= state["budget_ms"] for p in points))


def browser_shows(browser: Chromium, heads: str, within_s: float) -> List[str]:
    """What the browser's head count read, 5 times a second, until it read ``heads`` (or the time ran out)."""
    seen, deadline = [], time.monotonic() + within_s
    while time.monotonic() < deadline and heads not in seen:
        seen.append(browser.text("heads"))
        time.sleep(0.2)
    return seen


def test_under_a_cpu_load_the_app_steps_down_to_its_budget_comes_back_and_a_browser_sees_it(
        wide_board: Dict[str, Path], tmp_path: Path) -> None:
    allowed = os.sched_getaffinity(0)
    app_cores = {max(allowed)}  # the app and the load on one core; the browser and this test on the others
    other_cores = allowed - app_cores or app_cores
    day = scenario_steps(images_per_step=1)
    sysfs = tmp_path / "sysfs"
    board = board_app().SimulatedBoard(sysfs, day)
    board.apply(day[0])  # on the charger, cool: the table's choice is 12 heads

    unloaded = p90_of_the_tables_choice(wide_board, sysfs, app_cores, load=False)
    loaded = p90_of_the_tables_choice(wide_board, sysfs, app_cores, load=True)
    assert loaded > 2 * unloaded, f"the load barely slows 12 heads here (p90 {unloaded:.2f} -> {loaded:.2f} ms)"
    # between the two, two thirds of the way up on a log scale: met unloaded with the margin a shared
    # host's noise and the browser's drawing need, missed loaded
    budget = float(f"{unloaded ** (1 / 3) * loaded ** (2 / 3):.3g}")

    port, load, browser = free_port(), [], None
    out = tmp_path / "app.out"
    with pinned(app_cores), out.open("w") as stdout:
        app = subprocess.Popen(
            [sys.executable, str(APP), "--bundle", str(wide_board["bundle"]), "--lut", str(wide_board["lut"]),
             "--images", str(wide_board["images"]), "--sysfs-root", str(sysfs), "--threads", "1", "--poll-s", "0.25",
             "--budget-ms", str(budget), "--loop-window-s", str(WINDOW_S), "--loop-sustain-s", str(SUSTAIN_S),
             "--loop-dwell-s", str(DWELL_S), "--plain", "--serve", f"127.0.0.1:{port}"],
            stdout=stdout, stderr=subprocess.STDOUT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        wait_for(port, app, lambda s: s["heads"] == 12 and s["images"] >= 20, 60, "12 heads classifying")
        with pinned(other_cores):
            browser = Chromium(f"http://127.0.0.1:{port}/")
        assert browser_shows(browser, "12", 30)[-1] == "12"
        # unloaded, the table's choice fits (a burst of the shared host's own load may have cost heads for a
        # while: the loop gives them back, and this waits for it)
        settled = wait_for(port, app, lambda s: fits(s) and calm(s, round(WINDOW_S) + 1), 30,
                           "12 heads within budget")
        assert settled["budget_ms"] == budget
        # the app's times are seconds since it started: its clock is this one's less an offset, taken
        # from the snapshot just read (a tick old at most)
        offset = settled["t"] - time.monotonic()

        load, started = start_load(app_cores), time.monotonic()
        down = wait_for(port, app, lambda s: s["heads"] == 3 and fits(s), DOWN_WITHIN_S,
                        f"3 heads within the {budget} ms budget after the load started")
        step = down["switches"][-1]  # the step down came after the calm snapshot taken before the load
        assert step["from_heads"] == 12 and step["reason"].startswith("latency p90") and step["t"] > settled["t"], step
        down_after = step["t"] - (started + offset)
        seen = browser_shows(browser, "3", 5)
        assert seen[-1] == "3", seen

        stop(load)
        stopped = time.monotonic()
        wait_for(port, app, lambda s: s["heads"] == 12, BACK_WITHIN_S, "12 heads again after the load stopped")
        back_after = time.monotonic() - stopped
        assert browser_shows(browser, "12", 5)[-1] == "12"
        wait_for(port, app, lambda s: fits(s) and calm(s, 2), 10, "12 heads kept: the probe fitted")

        board.apply(day[4])  # the scripted day goes on: heavy use, very hot
        assert browser_shows(browser, "3", 5)[-1] == "3"
        switches = browser.text("switches") or ""
        assert browser.text("live") == "live" and browser.text("predicted") in read_manifest(wide_board["bundle"]).classes
        shot = browser.screenshot()
        assert shot.startswith(b"\x89PNG") and len(shot) > 10_000  # a page drawn, not a blank one
    finally:
        stop(load)
        if browser is not None:
            browser.close()
        app.terminate()
        app.wait(30)
    lines = [line for line in out.read_text().splitlines() if line.startswith("switch ")]
    said = re.search(r"12 -> 3 heads \[latency p90 ([\d.]+) ms over budget ([\d.]+) ms for (\d+) s", "\n".join(lines))
    assert said and float(said.group(1)) > budget and float(said.group(2)) == budget, lines
    assert int(said.group(3)) >= SUSTAIN_S
    assert any("3 -> 12 heads [latency back under budget" in line for line in lines), lines
    assert any(line.startswith("switch 12 -> 3 heads [state") for line in lines), lines  # the heat, not the load
    assert "over budget" in switches and "back under budget" in switches, switches  # the page says why
    assert re.search(r"12 \u2192 3 heads, state[^(\n]*\(battery [\d]+%, thermal 8\d\.\d\)", switches), switches  # and on what
    print(f"budget {budget} ms (12 heads p90 {unloaded:.2f} ms unloaded, {loaded:.2f} ms loaded); "
          f"3 heads {down_after:.1f} s after the load started, 12 again {back_after:.1f} s after it stopped")
