"""One device's calibration: push the bundle and the runner, time each head count, save as it comes.

The record on disk is the source of truth: every head count the device reports, and with the Python
runner every round and block of runs, is saved at once (``journal``), and a later run with the same
bundle and settings skips the head counts it already holds and goes on from the blocks of the others.
A dropped connection or Ctrl-C therefore costs at most the head count (with the Python runner, the
block) in flight, which the next run measures again; a runner that dies on an artefact (its exit
status arrives, see ``exits``) is recorded as crashed, so the next run goes on with the others.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import msgspec

from ..atomic import sha256_file
from ..calibration_plan import Gate, GateRule, StopRule, recorded_start
from ..errors import HydraEdgeError
from ..logs import LineLog, device_log, terminal
from ..records.calibration import Calibration, HeadResult, Round
from ..records.codec import convert
from ..records.fields import Heads, Name
from ..runtime.memory import MEMORY_FLOOR
from ..runtime.signals import DeviceState
from ..runtime.terminal import shown
from ..records.manifest import MANIFEST, ArtefactRecord, Manifest, bundle_files, read_manifest
from ..shipped import shipped
from ..transport import ConnectionLostError, RemoteCommandError, Transport, TransportError
from . import app as demo_app
from . import native
from .device import ensure_python, package_files, push_files, runtime_requirements
from .exits import exit_code, reporting_exit
from .journal import BlockEntry, RecordWriter, read_calibration
from .native_rounds import time_in_rounds
from .rounds import time_left
from .soak import derate

RUNNER = shipped("calibration", "runner.py")
RUNNER_IDLE_S = 1800.0  # the runner prints per artefact and per soak sample; silence this long is a hung runtime

T = TypeVar("T")
Report = Callable[[str, "int | None"], None]  # (stage, head count or None); called as work happens
Echo = Callable[[str], None]  # shows one line of the device's own output on the terminal (-v)


class LoadedLine(msgspec.Struct, forbid_unknown_fields=True):
    """The runner's ``loaded`` line: an artefact ready to time in the rounds."""

    heads: Heads
    artefact: Name


@dataclass(frozen=True)
class RoundsOptions:
    """How every runner times in rounds (``hydra_edge.calibration_plan``): its stop rule (beside ``runs``,
    the fewest runs), its blocks and its thermal gate."""

    within: float = 0.05
    min_s: float = 1.0
    cap_s: float = 60.0
    block_s: float = 0.25
    block_warmup: int = 2
    gate_margin_c: float = 2.0
    gate_headroom: float = 0.7
    gate_max_wait_s: float = 120.0

    def stop_rule(self, min_runs: int) -> StopRule:
        return StopRule(within=self.within, min_runs=min_runs, min_s=self.min_s, cap_s=self.cap_s)

    def gate_rule(self) -> GateRule:
        return GateRule(margin_c=self.gate_margin_c, headroom=self.gate_headroom, max_wait_s=self.gate_max_wait_s)

    def argv(self) -> list[str]:
        return ["--within", str(self.within), "--min-seconds", str(self.min_s), "--cap-seconds", str(self.cap_s),
                "--block-seconds", str(self.block_s), "--block-warmup", str(self.block_warmup),
                "--gate-margin-c", str(self.gate_margin_c), "--gate-headroom", str(self.gate_headroom),
                "--gate-max-wait-s", str(self.gate_max_wait_s)]


@dataclass(frozen=True)
class CalibrateOptions:
    """What ``hydra-edge calibrate`` was asked to do on each device."""

    bundle: Path
    runs: int = 50
    warmup: int = 10
    threads: int | None = None  # None: each artefact's target thread count
    quant: str | None = None  # which artefact per head count, when the bundle has several
    python: str = "python3"
    setup: bool = False
    pip_args: tuple[str, ...] = ()
    runner: Path | None = None  # a native benchmark binary instead of the Python runner
    app: bool = False  # the phone's demo app (bench mode) instead: it carries its bundle and runtime
    app_idle_s: float = demo_app.APP_IDLE_S  # the app silent this long: hung or killed
    soak_s: float | None = None
    soak_interval_s: float = 5.0
    sysfs_root: str | None = None  # tests: read the device's /sys under this root
    force: bool = False  # measure again even what the record already holds
    plan: RoundsOptions = field(default_factory=RoundsOptions)

    def settings(self, runner: str) -> dict[str, Any]:
        """What makes two runs' numbers comparable; a record with other settings is not resumed."""
        return {"runs": self.runs, "warmup": self.warmup, "threads": self.threads, "quant": self.quant,
                "runner": runner, "rounds": asdict(self.plan)}


def safe_name(device_id: str) -> str:
    """A device id as a file name: ``ssh:pi@host:22`` -> ``ssh_pi@host_22``."""
    return re.sub(r"[^A-Za-z0-9@._-]+", "_", device_id).strip("_.") or "device"


def select_artefacts(manifest: Manifest, quant: str | None = None) -> list[ArtefactRecord]:
    """One artefact per head count, ascending; ``quant`` picks when the bundle holds several."""
    if not manifest.artefacts:
        raise HydraEdgeError("the bundle has no artefacts; convert some into it with hydra-edge convert "
                             "(with --optional where the target's artefacts are all optional)")
    chosen = [a for a in manifest.artefacts if quant is None or a.quant == quant]
    quants = sorted({a.quant for a in manifest.artefacts})
    if not chosen:
        raise HydraEdgeError(f"the bundle has no {quant!r} artefacts; choose --quant from {quants}")
    if len({a.heads for a in chosen}) != len(chosen):
        raise HydraEdgeError(f"the bundle has several artefacts per head count ({', '.join(quants)}); "
                             "choose one with --quant")
    return sorted(chosen, key=lambda a: a.heads)


def bundle_record(bundle: Path, manifest: Manifest) -> dict[str, Any]:
    return {"path": str(bundle), "manifest_sha256": sha256_file(bundle / MANIFEST),
            "target": manifest.target.get("name")}


def resume_or_start(out: Path, device_id: str, bundle: dict[str, Any], settings: dict[str, Any],
                    force: bool) -> Calibration:
    """The record at ``out`` if it measured this bundle with these settings, else a fresh one.

    A file that is not a calibration is never overwritten: ``read_calibration`` says so.
    """
    fresh = Calibration(device_id=device_id, device={}, bundle=bundle, settings=settings)
    if force or not out.exists():
        return fresh
    old = read_calibration(out)
    differs = [what for what, same in (("device", old.device_id == device_id), ("settings", old.settings == settings),
                                       ("bundle", old.bundle.get("manifest_sha256") == bundle["manifest_sha256"]))
               if not same]
    if differs and old.results:
        raise HydraEdgeError(f"{out} holds measurements of another {' and '.join(differs)}; pass --force to "
                             "replace them, or --out to keep both")
    return fresh if differs else old


def _done(calibration: Calibration, artefact: ArtefactRecord) -> bool:
    """Measured, or known to crash the device's runtime (tried again only with --force)."""
    result = calibration.result(artefact.heads)
    return result is not None and (result.ok or result.status == "crashed") and result.sha256 == artefact.sha256


class Session:
    """Calibrates one bundle on one open transport, writing the record to ``out`` as it goes."""

    writer: RecordWriter  # made by run(), when there is something to measure

    def __init__(self, transport: Transport, opts: CalibrateOptions, out: Path, report: Report | None = None) -> None:
        self.t, self.opts, self.out = transport, opts, out
        self.report: Report = report or (lambda stage, heads: None)
        self.echo: Echo = lambda text: print(shown(text), file=terminal(), flush=True)  # the device's words
        self._said_no_forecast = False
        self._said_unloaded = False  # the runner released an engine for memory: said once
        self._round: Round | None = None  # the round the runner is in, and the head counts it has timed
        self._blocked: set[int] = set()
        self._reported: set[int] = set()  # head counts the runner has loaded or reported in this run
        self.manifest = read_manifest(opts.bundle)
        self.artefacts = select_artefacts(self.manifest, opts.quant)
        self.tool = native.tool_for(self.artefacts[0].format) if opts.runner else None
        if opts.app:  # one line before anything is measured or written
            demo_app.require_adb(transport)
            demo_app.check_formats(self.artefacts)
        runner = "app" if opts.app else self.tool.name if self.tool else "python"
        self.calibration = resume_or_start(out, transport.device_id, bundle_record(opts.bundle, self.manifest),
                                           opts.settings(runner), opts.force)
        self.bundle_rel = f"bundles/{self.calibration.bundle['manifest_sha256'][:16]}"  # under the base dir
        self.bundle_dir = transport.remote_path(self.bundle_rel)

    @property
    def todo(self) -> list[ArtefactRecord]:
        return [a for a in self.artefacts if not _done(self.calibration, a)]

    @property
    def soak_pending(self) -> bool:
        return bool(self.opts.soak_s) and (self.calibration.soak is None or self.opts.force)

    def run(self) -> Calibration:
        """Measure what the record lacks; on a lost connection say how much is safe and how to finish."""
        todo = self.todo
        if not todo and not self.soak_pending:
            self.report("already measured", None)
            return self.calibration
        self.writer = RecordWriter(self.calibration, self.out)
        try:
            if self.opts.app:  # the app carries its bundle: nothing to push
                self._run_app(todo)
            else:
                self._push(todo)
                if self.opts.runner:
                    self._run_native(todo)
                else:
                    self._run_python(todo)
        except TransportError as e:
            kept = f"{len(self.calibration.measured())} of {len(self.artefacts)} head counts"
            message = (f"calibrating {self.t.device_id} stopped: {e}; " + (
                f"{kept} are saved in {self.out}, run the same command again to finish" if self.opts.app
                else f"{kept} measured and every block timed so far are saved in {self.out}, "
                "run the same command again to go on"))
            raise (RemoteCommandError(message, e.result) if isinstance(e, RemoteCommandError)
                   else type(e)(message)) from None
        finally:
            self.writer.close()
        return self.calibration

    # --- steps ----------------------------------------------------------------------------

    def _put(self, result: HeadResult) -> None:
        self.writer.put(result)
        self.report(f"{result.status}", result.heads)
        self._say_no_forecast(result)

    def _say_no_forecast(self, result: HeadResult) -> None:
        """Once per run, one line when a device state carries a failed thermal headroom forecast the profile
        names: unless some state holds one, the table will select on the thermal status alone. The states are
        the device's JSON: ``errors`` may be anything, and its text is shown, never obeyed by the terminal."""
        errors = (state.get("errors") for state in (result.state_before, result.state_after) if isinstance(state, dict))
        why = next((e["headroom"] for e in errors if isinstance(e, dict) and e.get("headroom")), None)
        if why and not self._said_no_forecast:
            self._said_no_forecast = True
            self.echo(f"{self.t.device_id}: no thermal headroom forecast ({shown(str(why))}); unless it forecasts "
                      "later in this calibration, its table will not use the forecast: it selects on the thermal "
                      "status alone")

    def _in_flight(self, todo: list[ArtefactRecord]) -> ArtefactRecord | None:
        """The artefact the device was timing: in a round, the first of its order without a block yet;
        before the rounds, the first of ``todo`` the device has not reported (it loads them in turn)."""
        if self._round is not None:
            heads = next((h for h in self._round.order if h not in self._blocked), None)
            return next((a for a in todo if a.heads == heads), None)
        return next((a for a in todo if a.heads not in self._reported), None)

    def _soak_artefact(self) -> ArtefactRecord:
        return self.artefacts[-1]  # the most heads: the one that heats the device most

    def _push(self, todo: list[ArtefactRecord]) -> None:
        """The manifest and what the runner opens: for the Python runner the bundle's own files (a
        compact artefact's skeleton, recipe and source: it rebuilds them on the device), for a native
        tool a model file per artefact (a compact one rebuilt here, ``native.model_files``)."""
        self.report("pushing bundle", None)
        needed = todo + ([self._soak_artefact()] if self.soak_pending else [])
        bundle = self.opts.bundle
        digests: dict[str, str] = {}
        with ExitStack() as stack:
            if self.opts.runner:
                local = stack.enter_context(native.model_files(bundle, needed, digests))
            else:
                local = bundle_files(bundle, needed, digests=digests)
            files = {f"{self.bundle_rel}/{MANIFEST}": bundle / MANIFEST,
                     **{f"{self.bundle_rel}/{name}": path for name, path in local.items()}}
            if not self.opts.runner:
                files.update(runner_files("runner"))
            push_files(self.t, files, {f"{self.bundle_rel}/{name}": sha for name, sha in digests.items()})

    def _run_python(self, todo: list[ArtefactRecord]) -> None:
        self.report("checking python", None)
        python = ensure_python(self.t, self.opts.python, runtime_requirements(self.artefacts), self.opts.setup,
                               self.opts.pip_args)
        argv = [python, self.t.remote_path("runner", "calibration", "runner.py"), "--bundle", self.bundle_dir,
                "--runs", str(self.opts.runs), "--warmup", str(self.opts.warmup),
                "--threads", str(self.opts.threads or 0), *self.opts.plan.argv(), *self._resume_argv(todo),
                "--only", *[a.id for a in todo]]
        if self.soak_pending:
            argv += ["--soak-seconds", str(self.opts.soak_s), "--soak-artefact", self._soak_artefact().id,
                     "--soak-interval", str(self.opts.soak_interval_s)]
        if self.opts.sysfs_root:
            argv += ["--sysfs-root", self.opts.sysfs_root]
        samples: list[dict[str, Any]] = []
        if todo:
            self.report("timing", todo[0].heads)
        finished, status = False, None
        # What the runner and its runtimes print besides results goes to a log (with -v also here).
        with self._chatter("the runner's own output") as chatter, \
                self.t.stream(reporting_exit(argv), check=False, timeout=RUNNER_IDLE_S,
                              on_stderr=chatter.line) as lines:
            for line in lines:
                finished = self._on_line(line, todo, samples, chatter) or finished
                status = exit_code(line) if status is None else status
        if not finished:
            culprit = self._in_flight(todo)
            if status is None:  # the runner's status never came: the link dropped, not the runner
                raise ConnectionLostError(f"the connection to {self.t.device_id} dropped"
                                          + (f" while timing {culprit.heads} heads" if culprit else ""))
            said = lines.stderr.strip().splitlines()
            why = f"exit {status}: {said[-1] if said else 'no error text'}"
            # The runner itself died (a runtime that segfaults or is killed for memory) on the first
            # artefact it had not reported: record that, so a re-run goes on with the others
            # instead of dying on the same one again.
            if culprit is not None:
                self._crashed(culprit, "python", f"the runner died timing it ({why}); --force tries it again")
            raise HydraEdgeError(f"the runner on {self.t.device_id} stopped ({why}) before it finished"
                                 + (f"; {culprit.heads} heads is recorded as crashed, run again to measure the rest"
                                    if culprit else ""))
        if self.soak_pending:
            self._finish_soak(samples)

    def _crashed(self, culprit: ArtefactRecord, runner: str, error: str) -> None:
        """Record that the device's runner died timing ``culprit`` (so a re-run goes on with the others), with
        the blocks it had timed of it in this run."""
        timed = self.calibration.result(culprit.heads)
        blocks = timed.blocks if timed is not None and timed.status == "timing" else msgspec.UNSET
        self._put(HeadResult(culprit.heads, culprit.id, culprit.sha256, "crashed", runner, blocks=blocks, error=error))

    def _next_round(self) -> int:
        """The number a resumed calibration's first round gets: after the record's last, never a second 1."""
        return 1 + max((r.round for r in self.calibration.rounds or []), default=0)

    def _resume_argv(self, todo: list[ArtefactRecord]) -> list[str]:
        """``--resume FILE`` when the record holds blocks of head counts still timing: pushed beside the
        bundle, so the runner goes on from them, numbering its rounds after the record's last."""
        blocks = {a.id: [msgspec.to_builtins(b) for b in r.blocks or []] for a in todo
                  if (r := self.calibration.result(a.heads)) is not None and r.status == "timing"
                  and r.sha256 == a.sha256}
        if not any(blocks.values()) and not self.calibration.rounds:
            return []  # nothing to go on from, and no rounds to number after
        first = self._next_round()
        with tempfile.TemporaryDirectory(prefix="hydra-resume-") as tmp:
            local = Path(tmp) / "resume.json"
            local.write_text(json.dumps({"first_round": first, "blocks": blocks,
                                         "gate_start": recorded_start(self.calibration.rounds or [])}))
            push_files(self.t, {f"{self.bundle_rel}/resume.json": local})
        if any(blocks.values()):
            self.echo(f"{self.t.device_id}: going on from round {first} with the blocks the record holds")
        return ["--resume", f"{self.bundle_dir}/resume.json"]

    def _on_line(self, line: str, todo: list[ArtefactRecord], samples: list[dict[str, Any]], chatter: LineLog) -> bool:
        """Handle one runner line; True once the runner says it is done."""
        try:
            event = json.loads(line) if line.startswith("{") else None
        except ValueError:
            event = None
        if not isinstance(event, dict):
            if line.strip():
                chatter.line(line)  # a runtime's own chatter on stdout
            return False
        kind = event.get("event")
        if kind == "fatal":
            raise HydraEdgeError(f"{self.t.device_id}: {event.get('message')}")
        if kind == "device":
            self.writer.set_device({**event["device"], "runtimes": event.get("runtimes", {})})
        elif kind == "loaded":
            self._reported.add(self._checked(event, LoadedLine, "loaded").heads)
        elif kind == "result":
            result = self._result(event)
            self._reported.add(result.heads)
            self._blocked.add(result.heads)  # its part of this round is over: a death after it is another's
            self._put(result)
            following = [a.heads for a in todo if a.heads > result.heads]
            self.report("timing" if following else "soaking" if self.soak_pending else "finishing",
                        following[0] if following else None)
        elif kind == "unloaded" and not self._said_unloaded:
            self._said_unloaded = True
            self.echo(f"{self.t.device_id}: its memory cannot hold every head count loaded (under "
                      f"{MEMORY_FLOOR:.0%} of it available); those it released are loaded again for each of "
                      "their blocks, the loads counted toward --cap-seconds, not in the timings")
        elif kind == "round":
            self._round = self._checked(event, Round, "round")
            self._blocked = set()
            self.writer.put_round(self._round)
        elif kind == "block":
            entry = self._checked(event, BlockEntry, "block")
            held = self.calibration.result(entry.heads)
            if held is not None and held.ok:  # never replaced by a timing one: the device sent what it was not asked
                raise HydraEdgeError(f"{self.t.device_id} sent a block of runs for {entry.heads} heads, which "
                                     f"{self.out} holds measured and it was not asked to time; run again, which "
                                     "pushes this hydra-edge's runner afresh (or builds the app anew)")
            self._blocked.add(entry.heads)
            self.writer.put_block(entry)
            self.report(f"round {entry.block.round}" + self._time_left(), entry.heads)
        elif kind == "soak":
            samples.append({k: v for k, v in event.items() if k != "event"})
            self.report(f"soaking {event['t_s']:.0f}/{self.opts.soak_s:.0f} s", event.get("heads"))
        return kind == "done"

    def _result(self, event: dict[str, Any]) -> HeadResult:
        """A runner's result line as a checked record: a malformed one is never saved, so it cannot
        block later runs or the lookup table; the run stops with what came before it saved."""
        return self._checked(event, HeadResult, "result")

    def _checked(self, event: dict[str, Any], schema: type[T], what: str) -> T:
        """A runner line checked against its schema; a malformed one stops the run in one line, what came
        before it saved."""
        return convert({k: v for k, v in event.items() if k != "event"}, schema,
                       f"the runner on {self.t.device_id} sent a malformed {what} line",
                       f"the results before it are saved in {self.out}; run again, which pushes this "
                       "hydra-edge's runner afresh")

    def _time_left(self) -> str:
        """``, ~N s left``: each open head count's runs still needed at its interval's rate of
        narrowing (as 1/sqrt(n)), at its mean latency, within its cap; nothing while none is known."""
        left = time_left(self.calibration, self.opts.plan.within, self.opts.plan.cap_s)
        return "" if left is None else f", ~{left:.0f} s left"

    def _finish_soak(self, samples: list[dict[str, Any]]) -> None:
        self.calibration.soak = derate(self._soak_artefact().heads, float(self.opts.soak_s or 0), samples)
        self.writer.fold()

    def _run_native(self, todo: list[ArtefactRecord]) -> None:
        """A native binary in the plan's rounds, run from the host (``native_rounds``): each block one
        invocation of it."""
        assert self.opts.runner is not None and self.tool is not None
        tool = self.tool
        push_files(self.t, {f"bin/{self.opts.runner.name}": self.opts.runner})
        binary = self.t.remote_path("bin", self.opts.runner.name)
        self.t.run(["chmod", "755", binary])
        signals = self.manifest.target.get("signals", {})
        self.writer.set_device(native.remote_device_info(self.t))
        cores = native.device_cores(self.t)
        plan = self.opts.plan

        def state() -> DeviceState:
            return native.remote_state(self.t, signals)

        with self._chatter(f"{tool.name}'s own output") as chatter:
            def invoke(a: ArtefactRecord, runs: int, warmup: int) -> native.NativeRun:
                return native.invoke(self.t, tool, binary, f"{self.bundle_dir}/{a.file}", a, runs, warmup,
                                     device_threads(self.opts.threads or a.threads, cores), chatter.line)

            if todo:
                self.report("timing", todo[0].heads)
                gate = Gate(plan.gate_rule(), lambda: state().to_dict(), time.monotonic, time.sleep,
                            recorded_start(self.calibration.rounds or []))
                time_in_rounds(todo, self.calibration, tool, invoke, state, plan.stop_rule(self.opts.runs), gate,
                               plan.block_s, (self.opts.warmup, plan.block_warmup), self._next_round(), self,
                               lambda round_no, heads: self.report(f"round {round_no}" + self._time_left(), heads))
            if self.soak_pending:  # back-to-back runs of the binary, the state read between them
                soaked, samples, start = self._soak_artefact(), [], time.monotonic()
                while time.monotonic() - start < (self.opts.soak_s or 0):
                    result = native.run_native(self.t, tool, binary, f"{self.bundle_dir}/{soaked.file}", soaked,
                                               self.opts.runs, 0, device_threads(self.opts.threads or soaked.threads,
                                                                                 cores), signals, chatter.line)
                    samples.append(native.soak_sample(result, time.monotonic() - start))
                    self.report(f"soaking {time.monotonic() - start:.0f}/{self.opts.soak_s:.0f} s", soaked.heads)
                self._finish_soak(samples)

    # --- what the native rounds put (native_rounds.Sink) ------------------------------------

    def put_round(self, round_: Round) -> None:
        self.writer.put_round(round_)

    def put_block(self, entry: BlockEntry) -> None:
        self.writer.put_block(entry)

    def put_result(self, result: HeadResult) -> None:
        self._put(result)

    def _run_app(self, todo: list[ArtefactRecord]) -> None:
        """The demo app's bench mode: its lines go through ``_on_line`` as the Python runner's do. It times
        only what the record lacks (``--esa only``, as the runner's ``--only``), so a resumed run does not
        time again what was saved. A ``fatal`` line, a result for another bundle's artefact, a silent app or
        one that dies is one line; the app is then stopped. A death is recorded against the artefact it was
        timing, as the Python runner's is, so a re-run goes on with the others."""
        self.report("starting the app", None)
        samples: list[dict[str, Any]] = []
        finished = False
        try:
            with self._chatter("the app's other lines") as chatter:
                self._forget_timing(todo)
                lines = demo_app.bench_lines(self.t, self.opts.runs, self.opts.warmup, self.opts.threads or 0,
                                             [a.id for a in todo],
                                             {**asdict(self.opts.plan), "first_round": self._next_round()},
                                             self.opts.app_idle_s)
                self.report("timing", todo[0].heads if todo else None)
                for line in lines:
                    foreign = demo_app.foreign_result(line, self.artefacts)
                    if foreign:
                        raise HydraEdgeError(f"the demo app on {self.t.device_id} carries another bundle than "
                                             f"{self.opts.bundle} ({foreign}); calibrate the bundle its APK was "
                                             f"built from, or {demo_app.DEPLOY_HINT} and deploy that")
                    if self._on_line(line, todo, samples, chatter):
                        finished = True
                        break
        except demo_app.AppDied:
            culprit = self._in_flight(todo)
            timing = f"{culprit.heads} heads ({culprit.id})" if culprit else "its bench"
            if culprit is not None:
                self._crashed(culprit, "app", "the app died timing it; --force tries it again")
            raise HydraEdgeError(f"the demo app died on {self.t.device_id} while timing {timing}; "
                                 f"{demo_app.logcat_hint(self.t)} shows why"
                                 + ("; it is recorded as crashed, run again to measure the rest" if culprit else ""))
        finally:
            if not finished:
                demo_app.stop(self.t)
        missing = [a.heads for a in todo if self.calibration.result(a.heads) is None]
        if missing:
            raise HydraEdgeError(f"the demo app on {self.t.device_id} finished without timing "
                                 f"{', '.join(map(str, missing))} heads: its APK carries another bundle than "
                                 f"{self.opts.bundle}; {demo_app.DEPLOY_HINT} and deploy it")

    def _forget_timing(self, todo: list[ArtefactRecord]) -> None:
        """The app starts every head count it times afresh (it takes no blocks to go on from): the blocks an
        interrupted run left for them are dropped, so they are neither counted twice nor mixed with these."""
        stale = {a.heads for a in todo if (r := self.calibration.result(a.heads)) is not None and r.status == "timing"}
        if stale:
            self.calibration.results = [r for r in self.calibration.results if r.heads not in stale]
            self.writer.fold()

    def _chatter(self, what: str) -> LineLog:
        """The device's log (``logs/<device>.log`` beside the record), echoed here with -v."""
        return LineLog(device_log(self.out), f"{self.t.device_id}: {what}",
                       lambda text: self.echo(f"{self.t.device_id}: {text}"))


def device_threads(wanted: int, cores: int | None) -> int:
    """Never more runtime threads than the device has cores: oversubscribed runtimes spin and stall."""
    return min(wanted, cores) if cores else wanted


def runner_files(remote_root: str) -> dict[str, Path]:
    """The runner and the torch-free package it imports, as ``{device path: local file}``."""
    if not RUNNER.is_file():
        raise HydraEdgeError(f"the device runner {RUNNER} is missing from this installation; "
                             "reinstall hydra-edge from its source tree")
    return {f"{remote_root}/calibration/runner.py": RUNNER, **package_files(remote_root)}
