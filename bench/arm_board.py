"""An emulated Raspberry Pi: the real hydra-edge path against a Debian arm64 userland over ssh.

Builds (once, cached) a Debian bookworm arm64 userland with debootstrap, runs it under
qemu-user-static, starts that userland's own sshd on a loopback port (host key generated on the
"board", a throwaway client key, known_hosts and an ssh config: host keys are checked as against a
real board) and then does what a user does, with the real CLI on this machine:

  train (digits) -> convert --target rpi -> calibrate --setup --host BOARD -> lut
  -> deploy --setup --host BOARD (the app answers) -> the app on the board replays a scripted day (it switches)

``--setup`` makes a venv on the board and pip installs the aarch64 wheels (ai-edge-litert, numpy,
msgspec, pillow) there; their versions are reported. Every stage's wall time and result is printed
and saved to bench/results/arm_board.{json,md}. Emulated timings are evidence that the aarch64 path
works, not the speed of any device. Everything started here (sshd and whatever runs in the userland,
mounts, the binfmt_misc registration) is stopped or undone by PID / path on exit, Ctrl-C or failure.

Needs root, debootstrap and qemu-user-static (apt-get install debootstrap qemu-user-static):

    sudo .venv/bin/python bench/arm_board.py                       # userland cached in ~/.cache/hydra-edge/arm64-bookworm
    sudo .venv/bin/python bench/arm_board.py --cache /srv/arm64 --tflite-runtime
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.table import Table

from hydra_edge.atomic import write_json, write_text
from hydra_edge.commands.demo import demo_budget, export_images, scenario_steps
from hydra_edge.convert.targets import resolve
from hydra_edge.profiling.timing import host_cpu
from hydra_edge.transport import open_transport

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
PACKAGES = "python3,python3-venv,openssh-server"
BINFMT = Path("/proc/sys/fs/binfmt_misc")
QEMU_RULE = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")  # from qemu-user-static; flag F: works inside a chroot
READY = ".hydra-edge-userland"  # written once debootstrap finished: a half-built userland is rebuilt
BOARD_USER, ALIAS = "pi", "hydra-arm-board"
# The CPU qemu emulates: a Raspberry Pi 5's Cortex-A76. qemu's default ("max": SVE2, SME, i8mm, ...) is
# no Pi, and XNNPACK's kernels for it computed garbage under qemu 7.2 (docs/arm-board.md).
CPU, CPU_PART = "cortex-a76", "0xd0b"
BOARD_ETC = "etc/hydra-edge-board"  # the board's sshd config and host key, inside the userland
EMULATED = ("Timings are of an emulated CPU (qemu-user on this host): evidence that the aarch64 wheels and "
            "the whole path work, not the speed of a Raspberry Pi or any other device.")
BOARD_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "QEMU_CPU": CPU}  # what runs in the userland from here
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)  # a log file gets whole table rows


def sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kw)


def stream(argv: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 3600) -> str:
    """Run ``argv`` showing its output as it comes (and a heartbeat through long silences); return it.

    A non-zero exit raises with the command's own error line; past ``timeout`` it is stopped. The
    child gets its own session, so Ctrl-C here reaches it only through ``stop_pid`` below.
    """
    shown = " ".join(shlex.quote(a) for a in argv)
    console.print(f"[dim]$ {shown}[/dim]")
    start = last = time.monotonic()
    lines: list[str] = []
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(30):
            if time.monotonic() - start > timeout:
                lines.append(f"Error: stopped after {timeout:.0f} s")
                stop_pid(proc.pid, signals=(signal.SIGINT, signal.SIGTERM, signal.SIGKILL))
            elif time.monotonic() - last >= 30:
                console.print(f"[dim]  ... still running, {time.monotonic() - start:.0f} s[/dim]")

    threading.Thread(target=heartbeat, daemon=True).start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            last = time.monotonic()
            lines.append(line.rstrip("\n"))
            console.print(f"  {line.rstrip()}", markup=False)
        proc.wait()
    finally:
        done.set()
        if proc.poll() is None:  # Ctrl-C first: hydra-edge then stops what it started on the board itself
            stop_pid(proc.pid, signals=(signal.SIGINT, signal.SIGTERM, signal.SIGKILL))
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(f"$ {shown}\n" + "\n".join(lines) + "\n")
    if proc.returncode:
        said = [x.strip() for x in lines if x.strip()]
        reason = next((x for x in reversed(said) if x.startswith("Error")), said[-1] if said else "no output")
        raise RuntimeError(f"{reason} (exit {proc.returncode}; full output in {log})")
    return "\n".join(lines)


def stop_pid(pid: int, grace_s: float = 10.0, group: bool = True,
             signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL)) -> None:
    """Send ``signals`` in turn to the process group led by ``pid`` (or with ``group=False`` the
    process alone), each after the one before left ``pid`` running for ``grace_s``."""
    for sig in signals:
        try:
            (os.killpg if group else os.kill)(pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our child: poll for it
                if not Path(f"/proc/{pid}").exists():
                    return
                done = 0
            if done:
                return
            time.sleep(0.1)


def pids_inside(userland: Path) -> list[int]:
    """Every process whose root directory is ``userland``: what runs on the emulated board."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.path.realpath(entry / "root") == str(userland):
                    found.append(int(entry.name))
    return found


class Board:
    """The emulated board's life: each thing set up registers how to undo it, undone in reverse."""

    def __init__(self, userland: Path, keys: Path) -> None:
        self.userland, self.keys = userland.resolve(), keys
        self.undo = contextlib.ExitStack()
        self.ssh_config = keys / "ssh_config"

    def __enter__(self) -> "Board":
        return self

    def __exit__(self, *exc: object) -> None:
        console.rule("[bold]clean-up")
        self.undo.close()

    def later(self, what: str, fn: Callable[[], None]) -> None:
        def run() -> None:
            try:
                fn()
                console.print(f"  undone: {what}")
            except Exception as e:  # keep undoing the rest
                console.print(f"  [red]could not undo {what}: {e}[/red]")
        self.undo.callback(run)

    def binfmt(self) -> str:
        """aarch64 binaries run through qemu: mount binfmt_misc and register qemu if needed."""
        if not os.path.ismount(BINFMT):
            sh(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)])
            self.later(f"mount {BINFMT}", lambda: sh(["umount", str(BINFMT)]))
        entry = BINFMT / "qemu-aarch64"
        if not entry.exists():
            if not QEMU_RULE.is_file():
                raise RuntimeError(f"{QEMU_RULE} is missing; apt-get install qemu-user-static")
            (BINFMT / "register").write_text(QEMU_RULE.read_text().strip())
            self.later("binfmt_misc qemu-aarch64 registration", lambda: entry.write_text("-1"))
        return sh(["qemu-aarch64-static", "--version"]).stdout.splitlines()[0]

    def build(self, log: Path) -> str:
        """The userland: debootstrap once (3-8 min on a 2-core host), reused while its marker is there."""
        if (self.userland / READY).is_file():
            return f"reused {self.userland}"
        if self.userland.exists() and any(self.userland.iterdir()):
            raise RuntimeError(f"{self.userland} holds a half-built userland (no {READY}); remove it and run again")
        self.userland.mkdir(parents=True, exist_ok=True)
        stream(["debootstrap", "--arch=arm64", "--variant=minbase", f"--include={PACKAGES}", SUITE,
                str(self.userland), MIRROR], log)
        (self.userland / READY).write_text(f"debootstrap {SUITE} arm64 {PACKAGES}\n")
        return f"built {self.userland}"

    def mount(self) -> None:
        """/proc, /sys (read-only) and /dev (with /dev/pts) inside the userland, as a booted board has them.

        qemu-user 7.2 shows the host's own /proc/cpuinfo to aarch64 programs; XNNPACK's CPU detection
        (cpuinfo) reads it next to /sys and crashes on an x86 one, so the board gets a Cortex-A76's,
        one entry per host CPU as /sys lists them. Without /sys, XNNPACK is not used at all.
        """
        cpuinfo = self.keys / "cpuinfo"
        self.keys.mkdir(parents=True, exist_ok=True)
        cpuinfo.write_text("".join(
            f"processor\t: {n}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics "
            f"fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
            f"CPU variant\t: 0x4\nCPU part\t: {CPU_PART}\nCPU revision\t: 1\n\n" for n in range(os.cpu_count() or 1)))
        for argv, target in ((["-t", "proc", "proc"], "proc"), (["--bind", str(cpuinfo)], "proc/cpuinfo"),
                             (["-t", "sysfs", "-o", "ro", "sysfs"], "sys"),
                             (["--bind", "/dev"], "dev"), (["--bind", "/dev/pts"], "dev/pts")):
            path = self.userland / target
            if os.path.ismount(path):
                continue
            sh(["mount", *argv, str(path)])
            self.later(f"mount {path}", lambda p=path: sh(["umount", str(p)]))
        self.later("every process left in the userland", self.stop_inside)

    def stop_inside(self) -> None:
        for pid in pids_inside(self.userland):
            console.print(f"  stopping pid {pid} left on the board")
            stop_pid(pid, grace_s=5, group=False)

    def chroot(self, *argv: str, timeout: float = 600) -> str:
        return sh(["chroot", str(self.userland), *argv], timeout=timeout, env=BOARD_ENV).stdout

    def prepare(self) -> None:
        """A login user, the host's CA bundle for pip (a TLS-intercepting proxy), DNS; idempotent."""
        if subprocess.run(["chroot", str(self.userland), "id", BOARD_USER], capture_output=True, env=BOARD_ENV).returncode:
            self.chroot("useradd", "-m", "-s", "/bin/bash", BOARD_USER)
        self.chroot("usermod", "-p", "*", BOARD_USER)  # no password, yet not locked: sshd without PAM refuses locked
        ca = Path("/etc/ssl/certs/ca-certificates.crt")
        if ca.is_file():
            target = self.userland / "etc/ssl/certs/host-ca-certificates.crt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(ca.read_bytes())
            (self.userland / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/host-ca-certificates.crt\n")
        (self.userland / "etc/resolv.conf").write_text(Path("/etc/resolv.conf").read_text())

    def start_sshd(self) -> dict[str, Any]:
        """The board's sshd on 127.0.0.1:PORT with a host key made on the board; the client's files here."""
        etc = self.userland / BOARD_ETC
        etc.mkdir(parents=True, exist_ok=True)
        host_key = f"/{BOARD_ETC}/host_ed25519"
        if not (self.userland / host_key.lstrip("/")).is_file():
            self.chroot("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "arm-board", "-f", host_key)
        self.keys.mkdir(parents=True, exist_ok=True)
        client = self.keys / "client_ed25519"
        for stale in (client, client.with_suffix(".pub")):
            stale.unlink(missing_ok=True)
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "arm-board-client", "-f", str(client)])
        (etc / "authorized_keys").write_text(client.with_suffix(".pub").read_text())
        port = free_port()
        (etc / "sshd_config").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"AuthorizedKeysFile /{BOARD_ETC}/authorized_keys\nPidFile /{BOARD_ETC}/sshd.pid\n"
            "UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nSubsystem sftp internal-sftp\nLogLevel VERBOSE\n"
            f"SetEnv QEMU_CPU={CPU}\n")  # every program started over ssh runs on the same emulated CPU
        (self.userland / "run/sshd").mkdir(parents=True, exist_ok=True)
        host_pub = (self.userland / (host_key.lstrip("/") + ".pub")).read_text().split()
        known_hosts = self.keys / "known_hosts"
        known_hosts.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
        self.ssh_config.write_text(
            f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {BOARD_USER}\n  IdentityFile {client}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking yes\n")
        log = (self.keys / "sshd.log").open("wb")
        proc = subprocess.Popen(["chroot", str(self.userland), "/usr/sbin/sshd", "-D", "-e", "-f",
                                 f"/{BOARD_ETC}/sshd_config"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, env=BOARD_ENV)
        self.later(f"the board's sshd (pid {proc.pid})", lambda: (stop_pid(proc.pid), log.close()))
        deadline = time.monotonic() + 300  # an emulated sshd starts in seconds; a loaded host is slower
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the board's sshd exited {proc.returncode}: "
                                   f"{(self.keys / 'sshd.log').read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.5)
        else:
            raise RuntimeError("the board's sshd did not accept connections within 300 s")
        fingerprint = sh(["ssh-keygen", "-lf", str(known_hosts)]).stdout.split()[1]
        return {"pid": proc.pid, "port": port, "host_key": fingerprint}

    def run(self, argv: list[str], timeout: float = 1800) -> str:
        """A command on the board through the project's own ssh transport (host key checked)."""
        with open_transport(host=ALIAS, ssh_config=str(self.ssh_config)) as t:
            return t.run(argv, timeout=timeout).stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stages:
    """Each stage's wall time and one-line result, shown as it ends and kept for the report."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[dict[str, Any]]:
        console.rule(f"[bold]{name}")
        row: dict[str, Any] = {"stage": name, "ok": False, "result": ""}
        self.rows.append(row)
        start = time.monotonic()
        try:
            yield row
            row["ok"] = True
        except BaseException as e:
            row["result"] = f"FAILED: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
            raise
        finally:
            row["seconds"] = round(time.monotonic() - start, 1)
            console.print(f"[{'green' if row['ok'] else 'red'}]{name}: {row['result']} ({row['seconds']} s)")

    def table(self) -> Table:
        t = Table(title="hydra-edge on an emulated arm64 board")
        for col in ("stage", "wall s", "result"):
            t.add_column(col, justify="right" if col == "wall s" else "left")
        for r in self.rows:
            t.add_row(r["stage"], f"{r.get('seconds', 0):.1f}", ("" if r["ok"] else "[red]") + r["result"])
        return t


def cli(*args: object) -> list[str]:
    """``hydra-edge ARGS`` with this checkout's package, as a user types it."""
    return [sys.executable, "-m", "hydra_edge.cli", *map(str, args)]


def pip_versions(board: Board, python: str) -> dict[str, str]:
    out = board.run([python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"])
    return {p["name"]: p["version"] for p in json.loads(out)}


def tflite_runtime_probe(board: Board, artefact: str) -> dict[str, str]:
    """What ``pip install tflite-runtime`` gives on this board's Python, and whether it loads an artefact."""
    venv = "tflite-probe"
    board.run(["python3", "-m", "venv", venv])
    result: dict[str, str] = {}
    with open_transport(host=ALIAS, ssh_config=str(board.ssh_config)) as t:
        pip = t.run([f"{venv}/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "tflite-runtime",
                     "numpy<2"], check=False, timeout=3600)
        lines = [x for x in (pip.stdout + pip.stderr).splitlines() if x.strip()]
        result["pip"] = lines[-1] if lines else f"exit {pip.returncode}"
        if pip.returncode == 0:
            load = ("import sys, tflite_runtime; from tflite_runtime.interpreter import Interpreter; "
                    "i = Interpreter(model_path=sys.argv[1]); i.allocate_tensors(); "
                    "print('tflite-runtime', tflite_runtime.__version__, 'loaded', sys.argv[1])")
            ran = t.run([f"{venv}/bin/python", "-c", load, artefact], check=False, timeout=1800)
            said = [x.strip() for x in (ran.stdout + ran.stderr).splitlines() if x.strip()]
            # the interpreter's reason, not its closing "Registration failed."
            result["load"] = next((x for x in said if "Didn't find op" in x), said[-1] if said else f"exit {ran.returncode}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "hydra-edge" / "arm64-bookworm"),
                   help="the arm64 userland (built once, reused)")
    p.add_argument("--work", default=str(ROOT / "runs" / "arm-board"), help="checkpoint, bundle, table, keys")
    p.add_argument("--epochs", type=int, default=15, help="digits training epochs")
    p.add_argument("--heads", default="3,6,9,12", help="head counts to convert and calibrate")
    p.add_argument("--runs", type=int, default=10, help="timed runs per head count on the board")
    p.add_argument("--tflite-runtime", action="store_true", help="also report what pip install tflite-runtime gives there")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("Error: building and entering the arm64 userland needs root (debootstrap, chroot, mount); run with sudo")
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    log = work / "arm_board.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": str(console.width - 2)}  # the commands' tables fit in this script's indented output
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # killed: clean up as on Ctrl-C
    stages, report = Stages(), {"emulated": True, "note": EMULATED, "host_cpu": host_cpu(), "host": platform.node()}
    checkpoint, bundle, table = work / "run" / "checkpoint.pt", work / "bundle", work / "lut"
    calibration = work / "calibration" / "arm-board.json"
    ssh = ("--host", ALIAS, "--ssh-config", work / "keys" / "ssh_config")
    failed = None
    try:
        with Board(Path(args.cache), work / "keys") as board:
            with stages("qemu binfmt") as row:
                row["result"] = report["qemu"] = board.binfmt()
            with stages("arm64 userland") as row:
                built = board.build(log)
                board.mount()
                board.prepare()
                report["board_python"] = board.chroot("python3", "--version").strip()
                report["board_os"] = board.chroot("cat", "/etc/debian_version").strip()
                row["result"] = f"{built}: Debian {report['board_os']}, {report['board_python']}"
            with stages("board sshd") as row:
                sshd = board.start_sshd()
                report["board_machine"] = board.run(["uname", "-m"]).strip()
                report["board_cpu"] = f"qemu {board.run(['printenv', 'QEMU_CPU']).strip()}"  # as ssh sessions get it
                row["result"] = (f"pid {sshd['pid']} on 127.0.0.1:{sshd['port']}, host key {sshd['host_key']} "
                                 f"checked; {report['board_machine']}, {report['board_cpu']}")
            with stages("train (host)") as row:
                stream(cli("train", "--data", "digits", "--out", work / "run", "--epochs", args.epochs,
                           "--threads", "1", "--resume"), log, env)
                row["result"] = f"digits, {args.epochs} epochs: {checkpoint.relative_to(work)}"
            with stages("convert rpi (host)") as row:
                profile = work / "rpi-ups.toml"  # the demo's Pi on a UPS battery: the scripted day has one
                write_text(profile, resolve("rpi").read_text().replace("# battery_", "battery_"))
                stream(cli("convert", "--checkpoint", checkpoint, "--target", profile, "--out", bundle,
                           "--heads", args.heads, "--jobs", 2, "--quiet"), log, env)
                manifest = json.loads((bundle / "manifest.json").read_text())
                row["result"] = ", ".join(f"{a['heads']}h {a['accuracy']['top1']:.1f}%" for a in manifest["artefacts"])
            with stages("calibrate --setup (board)") as row:
                stream(cli("calibrate", "--bundle", bundle, *ssh, "--setup", "--out", calibration,
                           "--runs", args.runs, "--warmup", 2, "--threads", 1), log, env, timeout=4 * 3600)
                results = json.loads(calibration.read_text())["results"]
                report["calibration"] = {r["heads"]: {"status": r["status"], "golden": r["golden"],
                                                      "p50_ms": (r["latency"] or {}).get("p50_ms")} for r in results}
                bad = [r["heads"] for r in results if r["status"] != "ok"]
                if bad:
                    raise RuntimeError(f"head counts {bad} did not pass on the board: see {calibration}")
                row["result"] = ", ".join(f"{r['heads']}h golden ok, p50 {r['latency']['p50_ms']:.1f} ms"
                                          for r in results) + " (emulated)"
            python = f"/home/{BOARD_USER}/hydra-edge/venv/bin/python"  # the venv --setup made
            with stages("lut") as row:
                budget = demo_budget(bundle, calibration)
                stream(cli("lut", "--bundle", bundle, "--calibration", calibration, "--budget-ms", budget,
                           "--out", table), log, env)
                row["result"] = f"budget {budget} ms: {(table / 'lut.json').relative_to(work)}"
            with stages("deploy --setup (board app answers)") as row:
                images = work / "images"
                if not images.is_dir():
                    export_images(checkpoint, images, limit=60)
                out = stream(cli("deploy", "--bundle", bundle, "--lut", table, *ssh, "--setup", "--images", images,
                                 "--max-images", 20), log, env, timeout=3600)
                answered = [x for x in out.splitlines() if re.match(r"\s*\d+ heads: \d+ images", x)]
                if not answered:
                    raise RuntimeError("the app on the board printed no results")
                row["result"] = "; ".join(x.strip() for x in answered)
            with stages("board wheels") as row:
                report["board_wheels"] = pip_versions(board, python)
                row["result"] = ", ".join(f"{n} {report['board_wheels'][n]}" for n in
                                          ("ai-edge-litert", "numpy", "msgspec", "pillow") if n in report["board_wheels"])
            with stages("scripted day (board app switches)") as row:
                report["switches"] = scripted_day(board, python, images_per_step=3)
                row["result"] = " -> ".join(str(e["to"]) for e in report["switches"]) + " heads"
            if args.tflite_runtime:
                with stages("pip install tflite-runtime (board)") as row:
                    artefact = manifest["artefacts"][0]["file"]
                    report["tflite_runtime"] = tflite_runtime_probe(board, f"hydra-edge/app/bundle/{artefact}")
                    row["result"] = " | ".join(report["tflite_runtime"].values())
    except BaseException as e:  # noqa: BLE001  (Ctrl-C included: the clean-up above has run; report it)
        failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    report["stages"] = stages.rows
    report["failed"] = failed
    console.print(stages.table())
    if "board_wheels" in report:
        console.print("board wheels (pip list in the board's venv): " +
                      ", ".join(f"{k} {v}" for k, v in sorted(report["board_wheels"].items())))
    console.print(f"[bold]{EMULATED}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_json(RESULTS / "arm_board.json", report)
    write_text(RESULTS / "arm_board.md", markdown(report))
    console.print(f"saved {RESULTS / 'arm_board.json'} and .md; full log {log}")
    if failed:
        sys.exit(f"Error: {failed}")


def scripted_day(board: Board, python: str, images_per_step: int) -> list[dict[str, Any]]:
    """The deployed app on the board replays the demo's day on a simulated sysfs tree; its switch events."""
    app = f"/home/{BOARD_USER}/hydra-edge/app"
    with open_transport(host=ALIAS, ssh_config=str(board.ssh_config)) as t:
        day = board.keys / "scenario.json"
        write_json(day, {"steps": scenario_steps(images_per_step)})
        t.push(day, f"{app}/scenario.json")
        argv = [python, f"{app}/app.py", "--bundle", f"{app}/bundle", "--images", f"{app}/images", "--scenario",
                f"{app}/scenario.json", "--sysfs-root", f"{app}/sysfs", "--threads", "1", "--plain",
                "--log", f"{app}/events.json"]
        with t.stream(argv, env={"PYTHONPATH": app}, timeout=1800) as lines:
            for line in lines:
                console.print(f"  {line}", markup=False)
        events = json.loads(t.run(["cat", f"{app}/events.json"]).stdout)["events"]
    if len({e["to"] for e in events}) < 2:
        raise RuntimeError(f"the app on the board never switched: {events}")
    return events


def markdown(report: dict[str, Any]) -> str:
    rows = "\n".join(f"| {r['stage']} | {r.get('seconds', 0):.1f} | {r['result']} |" for r in report["stages"])
    wheels = ", ".join(f"{k} {v}" for k, v in sorted(report.get("board_wheels", {}).items())) or "-"
    return (f"# hydra-edge on an emulated arm64 board\n\n{report['note']}\n\n"
            f"Host: {report['host_cpu']}; {report.get('qemu', '')}; board: Debian {report.get('board_os', '?')} "
            f"{report.get('board_machine', '')} ({report.get('board_cpu', '?')}), {report.get('board_python', '')}\n\n"
            f"| stage | wall s | result |\n|---|---|---|\n{rows}\n\nBoard wheels: {wheels}\n"
            + ("".join(f"\ntflite-runtime on the board, {k}: {v}\n" for k, v in report["tflite_runtime"].items())
               if "tflite_runtime" in report else "")
            + (f"\nFailed: {report['failed']}\n" if report.get("failed") else ""))


if __name__ == "__main__":
    main()
