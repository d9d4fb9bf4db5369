"""A phone's side of adb over TCP, so the real ``adb`` client has something to drive.

Debian ships the adb client and server but no adbd and no emulator, so this daemon speaks just
enough of the ADB protocol (AOSP ``protocol.txt``, ``SERVICES.TXT``, ``SYNC.TXT``) for
``adb connect``, ``adb shell`` (shell protocol v2, exit codes), ``adb exec-out`` and
``adb push``/``adb pull`` (sync: STAT/LIST/SEND/RECV and the v2 stat/list forms). Commands run
under /bin/sh in a sandbox directory that stands in for ``/data/local/tmp``: that prefix is
mapped to the sandbox on the way in and back on the way out, so paths look like a phone's.
Not covered: USB, the RSA key prompt (``unauthorized`` mode only refuses).

It also plays the demo app's phone for ``hydra-edge deploy --apk`` and ``calibrate --runner app``
(``Phone``): ``adb install`` (the streamed ``abb_exec:package install`` service) keeps the APK as
``/data/app/<package>/base.apk``, and ``pm path`` and ``am start`` on the shell's PATH answer as a
phone's do; ``am start ... --es mode bench`` writes the test's lines to the app's bench file under
``/sdcard``, one at a time, as the app would. Every shell command and install it receives is
appended to ``phone/commands.jsonl`` under its root, so a test asserts what the host sent.

Run it as a process (the fixture does): ``python -m <package>.adbd --port P --root DIR``.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import re
import os
import queue
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from .processes import free_port, stop_process, wait_for_port

DEVICE_TMP = "/data/local/tmp"
VERSION = 0x01000001  # skips payload checksums, as every adb since 2016 does
MAX_PAYLOAD = 256 * 1024
SYNC_DATA_MAX = 64 * 1024
FEATURES = "shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir,abb_exec"

# Shell protocol v2 packet ids (one byte id, four byte little-endian length, payload).
STDIN, STDOUT, STDERR, EXIT, CLOSE_STDIN, WINDOW_SIZE = 0, 1, 2, 3, 4, 5


def _cmd(name: bytes) -> int:
    return struct.unpack("<I", name)[0]


CNXN, AUTH, OPEN, OKAY, CLSE, WRTE = (_cmd(n) for n in (b"CNXN", b"AUTH", b"OPEN", b"OKAY", b"CLSE", b"WRTE"))
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3


@dataclass
class Device:
    """What the phone says about itself, and where its /data/local/tmp really is."""

    sandbox: Path
    bin_dir: Path
    serial: str = "HYDRA0001"
    props: dict[str, str] = field(default_factory=dict)
    unauthorized: bool = False

    def __post_init__(self) -> None:
        defaults = {"ro.product.model": "Hydra Test Phone", "ro.product.name": "hydra_test",
                    "ro.product.device": "hydra", "ro.product.manufacturer": "hydra-edge",
                    "ro.serialno": self.serial, "ro.build.version.release": "14",
                    "ro.build.version.sdk": "34", "ro.product.cpu.abi": "arm64-v8a"}
        self.props = {**defaults, **self.props}

    def banner(self) -> bytes:
        keys = ("ro.product.name", "ro.product.model", "ro.product.device")
        return ("device::" + "".join(f"{k}={self.props[k]};" for k in keys) + f"features={FEATURES}").encode()

    @property
    def phone(self) -> "Phone":
        return Phone(self.sandbox.parent / "phone")

    def mounts(self) -> dict[str, Path]:
        """Phone folders and where they really are: /data/local/tmp, and the app's /sdcard and /data/app."""
        return {DEVICE_TMP: self.sandbox, SDCARD: self.phone.dir / "sdcard", DATA_APP: self.phone.dir / "data-app"}

    def map_in(self, command: str) -> str:
        """A shell command with every mounted phone path as this machine's."""
        mounts = self.mounts()
        return re.sub("|".join(re.escape(p) for p in mounts), lambda m: str(mounts[m.group(0)]), command)

    def to_host(self, path: str) -> Path:
        """A phone path as a path on this machine (only the mounted folders are remapped)."""
        for prefix, host in self.mounts().items():
            if path == prefix or path.startswith(prefix + "/"):
                return Path(str(host) + path[len(prefix):])
        return Path(path)

    def writable(self, path: str) -> bool:
        return path == DEVICE_TMP or path.startswith(DEVICE_TMP + "/")

    def write_getprop(self) -> None:
        """A ``getprop`` on the shell's PATH answering from ``props``, like the phone's."""
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        cases = "".join(f"  {_sh_quote(k)}) printf '%s\\n' {_sh_quote(v)} ;;\n" for k, v in self.props.items())
        listing = "".join(f"[{k}]: [{v}]\n" for k, v in sorted(self.props.items()))
        script = self.bin_dir / "getprop"
        script.write_text(f'#!/bin/sh\nif [ $# -eq 0 ]; then cat <<\'EOF\'\n{listing}EOF\nexit 0; fi\n'
                          f'case "$1" in\n{cases}  *) echo ;;\nesac\n')
        script.chmod(0o755)

    def write_phone_tools(self) -> None:
        """``am``, ``pm`` and ``pidof`` on the shell's PATH, answered by ``Phone`` (this module run as a tool)."""
        for tool in ("am", "pm", "pidof"):
            script = self.bin_dir / tool
            script.write_text(f"#!/bin/sh\nexec {_sh_quote(sys.executable)} -m {__package__}.adbd --phone-tool {tool} "
                              f"--root {_sh_quote(str(self.sandbox.parent))} -- \"$@\"\n")
            script.chmod(0o755)


SDCARD, DATA_APP = "/sdcard", "/data/app"
APP_ACTIVITY = "MainActivity"  # the one Activity every installed app has here


@dataclass
class Phone:
    """The app side of the stand-in phone, kept in files under ``dir`` so a test can set it and read it.

    Set by the test: ``install-answer`` (what ``adb install`` answers instead of ``Success``),
    ``apk-package`` (the package an installed APK declares; default the demo app's), ``bench-lines``
    (what the app writes in bench mode; a ``result`` line for an artefact ``--esa only`` leaves out is not
    written, as the app times only those), ``bench-delay`` (seconds between those lines), ``bench-torn``
    (seconds each line's write pauses halfway, flushed: a reader finds half a line), ``start-s`` (seconds
    after ``am start`` before the app's process is listed by ``pidof`` and writes anything: an app slow to
    start) and ``bench-end`` (after its lines the app ``stays``, as a real one does showing its summary, or
    ``exits`` as a crash does; default ``stays``). Read by the test: ``commands.jsonl`` (one JSON object per
    shell command or install received, and what each ``pidof`` found).
    """

    dir: Path
    package_default: str = "org.hydraedge.demo"

    def log(self, entry: dict[str, object]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with _LOG_LOCK, open(self.dir / "commands.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")

    def commands(self) -> list[dict[str, object]]:
        path = self.dir / "commands.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    def setting(self, name: str, default: str) -> str:
        path = self.dir / name
        return path.read_text().strip() if path.is_file() else default

    def installed(self, package: str) -> Path:
        return self.dir / "data-app" / package / "base.apk"

    def install(self, apk: bytes) -> str:
        """What ``pm install`` answers; on ``Success`` the APK is kept as its package's base.apk."""
        answer = self.setting("install-answer", "Success")
        if answer == "Success":
            target = self.installed(self.setting("apk-package", self.package_default))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(apk)
        return answer

    def bench_file(self, package: str) -> Path:
        return self.dir / "sdcard" / "Android" / "data" / package / "files" / "bench.jsonl"

    def stop_app(self) -> None:
        """``am force-stop`` / ``am start -S``: the bench writer of an earlier start ends."""
        pid = self.dir / "app.pid"
        if pid.is_file():
            try:
                os.killpg(int(pid.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError, PermissionError):
                pass
            pid.unlink(missing_ok=True)
        (self.dir / "app.listed-at").unlink(missing_ok=True)

    def listed_at(self) -> float:
        """When the started app's process shows in ``pidof`` (its ``am start`` plus ``start-s``)."""
        path = self.dir / "app.listed-at"
        return float(path.read_text()) if path.is_file() else 0.0

    def am(self, argv: list[str]) -> int:
        """``am start [-S] [-W] -n PKG/.Activity [--es|--ei|--ez KEY VALUE]...`` and ``am force-stop PKG``."""
        if argv[:1] == ["force-stop"]:
            self.stop_app()
            return 0
        if argv[:1] != ["start"]:
            print(f"Error: unknown command {argv[:1]}", file=sys.stderr)
            return 255
        component, extras, words = None, {}, argv[1:]
        while words:
            word = words.pop(0)
            if word == "-S":
                self.stop_app()
            elif word == "-W":
                pass
            elif word == "-n" and words:
                component = words.pop(0)
            elif word == "--esa" and len(words) >= 2:  # a string array: comma-separated, "\\," a comma
                key, value = words.pop(0), words.pop(0)
                extras[key] = [item.replace("\\,", ",") for item in re.split(r"(?<!\\),", value)]
            elif word in ("--es", "--ei", "--ez") and len(words) >= 2:
                key, value = words.pop(0), words.pop(0)
                if word == "--ei" and not re.fullmatch(r"-?[0-9]+", value):
                    print(f"Error: {value!r} is not an integer", file=sys.stderr)
                    return 255
                extras[key] = value
            else:
                print(f"Error: unknown option {word}", file=sys.stderr)
                return 255
        if component is None:
            print("Error: no component (-n)", file=sys.stderr)
            return 255
        package, _, activity = component.partition("/")
        activity = package + activity if activity.startswith(".") else activity
        print(f"Starting: Intent {{ cmp={component} }}")
        if not self.installed(package).is_file() or activity != f"{package}.{APP_ACTIVITY}":
            print("Error type 3", file=sys.stderr)
            print(f"Error: Activity class {{{package}/{activity}}} does not exist.", file=sys.stderr)
            return 255
        if extras.get("mode") == "bench":  # the app's worker thread: runs on after am returns
            only = extras.get("only")
            (self.dir / "app.listed-at").write_text(repr(time.time() + float(self.setting("start-s", "0"))))
            proc = subprocess.Popen([sys.executable, "-m", f"{__package__}.adbd", "--phone-tool", "bench-app",
                                     "--root", str(self.dir.parent), "--", package,
                                     *(["--only", *only] if isinstance(only, list) else [])],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
            (self.dir / "app.pid").write_text(str(proc.pid))
        return 0

    def pm(self, argv: list[str]) -> int:
        """``pm path PKG``: ``package:/data/app/PKG/base.apk``, or nothing and 1 when it is not installed."""
        if len(argv) == 2 and argv[0] == "path":
            if self.installed(argv[1]).is_file():
                print(f"package:{DATA_APP}/{argv[1]}/base.apk")
                return 0
            return 1
        print(f"Error: unknown command {argv}", file=sys.stderr)
        return 255

    def pidof(self, argv: list[str]) -> int:
        """``pidof PKG``: the bench app's process id while it runs (a zombie is gone), else nothing and 1."""
        pid = self.dir / "app.pid"
        if argv == [self.package_default] and pid.is_file() and time.time() >= self.listed_at():
            stat = Path(f"/proc/{pid.read_text().strip()}/stat")
            if stat.is_file() and stat.read_text().split(") ")[-1][:1] != "Z":
                print(pid.read_text().strip())
                self.log({"pidof": "listed"})
                return 0
        self.log({"pidof": "none"})
        return 1

    def bench_app(self, args: list[str]) -> None:
        """The app in bench mode (``PKG [--only ID...]``): its file started afresh, then the test's lines one
        at a time, those of the artefacts asked for; then it stays, or exits (``bench-end``)."""
        package, only = args[0], (set(args[2:]) if args[1:2] == ["--only"] else None)
        out = self.bench_file(package)
        out.parent.mkdir(parents=True, exist_ok=True)
        lines = self.dir / "bench-lines"
        delay, torn = float(self.setting("bench-delay", "0.05")), float(self.setting("bench-torn", "0"))
        time.sleep(max(0.0, self.listed_at() - time.time()))
        with open(out, "w") as f:
            for line in (lines.read_text().splitlines() if lines.is_file() else []):
                event = json.loads(line) if line.startswith("{") else {}
                if only is not None and event.get("event") == "result" and event.get("artefact") not in only:
                    continue
                time.sleep(delay)
                for part in ((line[:len(line) // 2], line[len(line) // 2:] + "\n") if torn else (line + "\n",)):
                    f.write(part)
                    f.flush()
                    time.sleep(torn)
        if self.setting("bench-end", "stays") == "stays":
            time.sleep(3600)  # the Activity stays open; am force-stop (or am start -S) ends it


_LOG_LOCK = threading.Lock()


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


class Unmapper:
    """Rewrites the mounted folders (the sandbox: /data/local/tmp, ...) back to phone paths in output
    split across chunks."""

    def __init__(self, mounts: dict[str, Path]) -> None:
        self.back = {str(host).encode(): phone.encode() for phone, host in mounts.items()}
        self.pattern = re.compile(b"|".join(re.escape(old) for old in self.back))
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.pattern.sub(lambda m: self.back[m.group(0)], self.pending + chunk)
        hold = max((k for old in self.back for k in range(min(len(old) - 1, len(data)), 0, -1)
                    if data.endswith(old[:k])), default=0)  # a match cut by the chunk boundary
        self.pending = data[len(data) - hold:] if hold else b""
        return data[:len(data) - hold]

    def flush(self) -> bytes:
        out, self.pending = self.pending, b""
        return out


class Channel:
    """One OPENed stream: ordered, flow-controlled writes and a queue of what the host sent."""

    def __init__(self, conn: "Connection", local_id: int, remote_id: int) -> None:
        self.conn, self.local_id, self.remote_id = conn, local_id, remote_id
        self.inbox: "queue.Queue[bytes | None]" = queue.Queue()
        self.ready = threading.Event()
        self.ready.set()
        self.closed = False
        self.write_lock = threading.Lock()
        self.buffer = b""
        self.process: subprocess.Popen | None = None  # a shell command to stop if the host goes away

    def write(self, data: bytes) -> None:
        """Send data, one WRTE at a time, each waiting for the host's OKAY."""
        with self.write_lock:
            for start in range(0, len(data), self.conn.max_payload):
                self.ready.wait()
                if self.closed:
                    raise BrokenPipeError("host closed the stream")
                self.ready.clear()
                self.conn.send(WRTE, self.local_id, self.remote_id, data[start:start + self.conn.max_payload])

    def read(self) -> bytes | None:
        """The next payload from the host, or None once it closed the stream."""
        if self.buffer:
            data, self.buffer = self.buffer, b""
            return data
        return self.inbox.get()

    def read_exact(self, n: int) -> bytes:
        while len(self.buffer) < n:
            data = self.inbox.get()
            if data is None:
                raise EOFError("host closed the stream")
            self.buffer += data
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def peer_closed(self) -> None:
        """The host closed the stream (client killed, Ctrl-C, disconnect): stop its command too."""
        self.closed = True
        self.inbox.put(None)
        self.ready.set()
        if self.process is not None:
            _kill_group(self.process)

    def close(self) -> None:
        """This end is done (its command exited): as adbd closing the socket, the command's stdin ends too, so
        what still reads it (the host's watcher of a finished command) ends, not lives as long as the daemon."""
        self.inbox.put(None)
        if not self.closed:
            self.closed = True
            self.ready.set()
            self.conn.send(CLSE, self.local_id, self.remote_id)
        self.conn.channels.pop(self.local_id, None)


class Connection:
    """One host (the adb server) connected over TCP."""

    def __init__(self, sock: socket.socket, device: Device) -> None:
        self.sock, self.device = sock, device
        self.send_lock = threading.Lock()
        self.channels: dict[int, Channel] = {}
        self.next_id = 1
        self.max_payload = MAX_PAYLOAD

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None:
        header = struct.pack("<6I", command, arg0, arg1, len(data), sum(data) & 0xFFFFFFFF, command ^ 0xFFFFFFFF)
        with self.send_lock:
            self.sock.sendall(header + data)

    def _recv_exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    def serve(self) -> None:
        try:
            while True:
                command, arg0, arg1, length, _, magic = struct.unpack("<6I", self._recv_exact(24))
                if magic != command ^ 0xFFFFFFFF:
                    raise EOFError("bad packet magic")
                self.dispatch(command, arg0, arg1, self._recv_exact(length) if length else b"")
        except (EOFError, OSError):
            pass
        finally:
            for channel in list(self.channels.values()):
                channel.peer_closed()
            self.sock.close()

    def dispatch(self, command: int, arg0: int, arg1: int, data: bytes) -> None:
        if command == CNXN:
            self.max_payload = min(arg1, MAX_PAYLOAD)
            if self.device.unauthorized:
                self.send(AUTH, AUTH_TOKEN, 0, os.urandom(20))
            else:
                self.send(CNXN, VERSION, MAX_PAYLOAD, self.device.banner())
        elif command == AUTH and arg0 == AUTH_SIGNATURE:
            self.send(AUTH, AUTH_TOKEN, 0, os.urandom(20))  # no signature is ever accepted
        elif command == OPEN:
            local_id, self.next_id = self.next_id, self.next_id + 1
            service = data.rstrip(b"\0").decode(errors="replace")
            handler = service_for(service)
            if handler is None:
                self.send(CLSE, 0, arg0)
                return
            channel = Channel(self, local_id, arg0)
            self.channels[local_id] = channel
            self.send(OKAY, local_id, arg0)
            threading.Thread(target=_run_service, args=(handler, channel, service), daemon=True).start()
        elif command == WRTE and arg1 in self.channels:
            self.channels[arg1].inbox.put(data)
            self.send(OKAY, arg1, arg0)
        elif command == OKAY and arg1 in self.channels:
            self.channels[arg1].ready.set()
        elif command == CLSE and arg1 in self.channels:
            self.channels.pop(arg1).peer_closed()


def _run_service(handler: Callable[[Channel, str], None], channel: Channel, service: str) -> None:
    try:
        handler(channel, service)
    except (BrokenPipeError, EOFError, OSError):
        pass
    finally:
        channel.close()


# --- shell and exec --------------------------------------------------------------------------


def shell_service(channel: Channel, service: str) -> None:
    """``shell[,v2][,raw|,pty][,TERM=..]:cmd`` and ``exec:cmd`` under /bin/sh in the sandbox."""
    head, _, command = service.partition(":")
    args = head.split(",")[1:]
    device = channel.conn.device
    v2 = head.startswith("shell") and "v2" in args
    device.phone.log({"shell": command})
    argv = ["/bin/sh", "-c", device.map_in(command)] if command else ["/bin/sh"]
    env = {**os.environ, "PATH": f"{device.bin_dir}:/usr/local/bin:/usr/bin:/bin",
           "HOME": str(device.sandbox), "TMPDIR": str(device.sandbox), "ANDROID_DATA": "/data"}
    stderr = subprocess.PIPE if v2 else (subprocess.DEVNULL if head == "exec" else subprocess.STDOUT)
    proc = subprocess.Popen(argv, cwd=device.sandbox, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=stderr, start_new_session=True)
    channel.process = proc
    RUNNING.add(proc)
    if channel.closed:  # the host left while we were starting
        _kill_group(proc)
    try:
        threading.Thread(target=_feed_stdin, args=(channel, proc, v2), daemon=True).start()
        pumps = [threading.Thread(target=_pump, args=(channel, pipe, packet_id if v2 else None), daemon=True)
                 for pipe, packet_id in ((proc.stdout, STDOUT), (proc.stderr, STDERR)) if pipe]
        for pump in pumps:
            pump.start()
        for pump in pumps:
            pump.join()
        returncode = proc.wait()
        if v2:
            channel.write(_packet(EXIT, bytes([returncode & 0xFF])))
    finally:
        _kill_group(proc)
        RUNNING.discard(proc)


RUNNING: set[subprocess.Popen] = set()  # commands to stop when the daemon itself is stopped


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _packet(packet_id: int, data: bytes) -> bytes:
    return struct.pack("<BI", packet_id, len(data)) + data


def _pump(channel: Channel, pipe, packet_id: int | None) -> None:
    unmap = Unmapper(channel.conn.device.mounts())
    try:
        for chunk in iter(lambda: pipe.read1(SYNC_DATA_MAX), b""):
            data = unmap.feed(chunk)
            if data:
                channel.write(data if packet_id is None else _packet(packet_id, data))
        rest = unmap.flush()
        if rest:
            channel.write(rest if packet_id is None else _packet(packet_id, rest))
    except BrokenPipeError:
        pass


def _feed_stdin(channel: Channel, proc: subprocess.Popen, v2: bool) -> None:
    """Host input to the command; with v2 it arrives as packets (data, close-stdin, window size)."""
    try:
        while True:
            if v2:
                packet_id, length = struct.unpack("<BI", channel.read_exact(5))
                data = channel.read_exact(length)
                if packet_id == STDIN:
                    proc.stdin.write(data)
                    proc.stdin.flush()
                elif packet_id == CLOSE_STDIN:
                    break
            else:
                data = channel.read()
                if data is None:
                    break
                proc.stdin.write(data)
                proc.stdin.flush()
    except (EOFError, OSError):
        pass
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


# --- sync (push, pull, stat, ls) ---------------------------------------------------------------


def _sync_header(channel: Channel) -> tuple[bytes, int]:
    return channel.read_exact(4), struct.unpack("<I", channel.read_exact(4))[0]


def _fail(channel: Channel, message: str) -> None:
    data = message.encode()
    channel.write(b"FAIL" + struct.pack("<I", len(data)) + data)


def _stat_v1(st: os.stat_result | None) -> bytes:
    if st is None:
        return struct.pack("<3I", 0, 0, 0)
    return struct.pack("<3I", st.st_mode, st.st_size & 0xFFFFFFFF, int(st.st_mtime))


def _stat_v2(st: os.stat_result | None, error: int = 0) -> bytes:
    if st is None:
        return struct.pack("<IQQ4IQ3q", error, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    return struct.pack("<IQQ4IQ3q", 0, st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid, st.st_gid,
                       st.st_size, int(st.st_atime), int(st.st_mtime), int(st.st_ctime))


def _lstat(path: Path) -> tuple[os.stat_result | None, int]:
    try:
        return os.lstat(path), 0
    except OSError as e:
        return None, e.errno or errno.ENOENT


def _entries(path: Path) -> Iterator[tuple[str, os.stat_result]]:
    for name in [".", "..", *sorted(os.listdir(path))]:
        st, _ = _lstat(path / name)
        if st is not None:
            yield name, st


def sync_service(channel: Channel, service: str) -> None:
    device = channel.conn.device
    while True:
        request, length = _sync_header(channel)
        if request == b"QUIT":
            return
        path = channel.read_exact(length).decode(errors="surrogateescape")
        if request == b"STAT":
            channel.write(b"STAT" + _stat_v1(_lstat(device.to_host(path))[0]))
        elif request in (b"STA2", b"LST2"):
            host = device.to_host(path)
            try:
                st, error = (os.stat(host) if request == b"STA2" else os.lstat(host)), 0
            except OSError as e:
                st, error = None, e.errno or errno.ENOENT
            channel.write(request + _stat_v2(st, error))
        elif request in (b"LIST", b"LIS2"):
            host = device.to_host(path)
            entries = list(_entries(host)) if host.is_dir() else []
            for name, st in entries:
                raw = name.encode(errors="surrogateescape")
                body = _stat_v1(st) if request == b"LIST" else _stat_v2(st)
                tag = b"DENT" if request == b"LIST" else b"DNT2"
                channel.write(tag + body + struct.pack("<I", len(raw)) + raw)
            channel.write(b"DONE" + (b"\0" * (16 if request == b"LIST" else 72)))
        elif request == b"SEND":
            _receive_file(channel, device, path)
        elif request == b"RECV":
            _send_file(channel, device, path)
        else:
            _fail(channel, f"unknown sync request {request!r}")
            return


def _receive_file(channel: Channel, device: Device, spec: str) -> None:
    """SEND "path,mode": DATA chunks until DONE(mtime), then OKAY or FAIL with the reason."""
    path, _, mode = spec.rpartition(",")
    error = None if device.writable(path) else "Permission denied"
    out = None
    if error is None:
        target = device.to_host(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            out = open(target, "wb")
        except OSError as e:
            error = f"couldn't create file: {e.strerror}"
    try:
        while True:
            kind, length = _sync_header(channel)
            if kind == b"DONE":
                break
            data = channel.read_exact(length)
            if out is not None and error is None:
                try:
                    out.write(data)
                except OSError as e:
                    error = e.strerror
    finally:
        if out is not None:
            try:
                out.close()
            except OSError as e:
                error = error or e.strerror
    if error is None:
        os.chmod(device.to_host(path), int(mode or "0644") & 0o777)
        channel.write(b"OKAY" + struct.pack("<I", 0))
    else:
        _fail(channel, error)


def _send_file(channel: Channel, device: Device, path: str) -> None:
    try:
        with open(device.to_host(path), "rb") as f:
            for block in iter(lambda: f.read(SYNC_DATA_MAX), b""):
                channel.write(b"DATA" + struct.pack("<I", len(block)) + block)
    except OSError as e:
        _fail(channel, e.strerror or "read failed")
        return
    channel.write(b"DONE" + struct.pack("<I", 0))


def install_service(channel: Channel, service: str) -> None:
    """``abb_exec:package\\0install\\0[options]\\0-S\\0SIZE`` (``adb install``, streamed): SIZE bytes of APK
    in, one status line out (``Success``, or ``Failure [...]`` as the test set it)."""
    argv = service[len("abb_exec:"):].split("\0")
    phone = channel.conn.device.phone
    if argv[:2] != ["package", "install"] or "-S" not in argv[:-1]:
        phone.log({"abb_exec": argv})
        channel.write(f"Failure [the stand-in only installs: {argv}]\n".encode())
        return
    apk = channel.read_exact(int(argv[argv.index("-S") + 1]))
    phone.log({"abb_exec": argv, "bytes": len(apk), "sha256": hashlib.sha256(apk).hexdigest()})
    channel.write((phone.install(apk) + "\n").encode())


def service_for(service: str) -> Callable[[Channel, str], None] | None:
    if service.startswith(("shell:", "shell,", "exec:")):
        return shell_service
    if service.startswith("abb_exec:"):
        return install_service
    if service == "sync:":
        return sync_service
    return None


# --- the daemon process and its test fixtures ---------------------------------------------------


def serve(device: Device, port: int) -> None:
    """Accept hosts on 127.0.0.1:port until killed."""
    device.sandbox.mkdir(parents=True, exist_ok=True)
    device.write_getprop()
    device.write_phone_tools()
    listener = socket.create_server(("127.0.0.1", port))
    while True:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=Connection(sock, device).serve, daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phone-tool", choices=("am", "pm", "pidof", "bench-app"), default=None,
                        help="answer as the phone's am, pm or pidof (or be the app's bench mode), then exit")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--root", type=Path, required=True, help="holds sandbox/ (/data/local/tmp) and bin/")
    parser.add_argument("--serial", default="HYDRA0001")
    parser.add_argument("--prop", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--unauthorized", action="store_true", help="never accept the host's key")
    parser.add_argument("tool_args", nargs="*", help="--phone-tool's arguments, after --")
    args = parser.parse_args(argv)
    if args.phone_tool is not None:
        phone = Phone(args.root / "phone")
        if args.phone_tool == "bench-app":
            phone.bench_app(args.tool_args)
            return
        sys.exit(getattr(phone, args.phone_tool)(args.tool_args))
    if args.port is None:
        parser.error("--port is required")
    props = dict(item.split("=", 1) for item in args.prop)
    device = Device(args.root / "sandbox", args.root / "bin", args.serial, props, args.unauthorized)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        serve(device, args.port)
    finally:
        for proc in list(RUNNING):
            _kill_group(proc)


@dataclass
class AdbServer:
    """An ``adb nodaemon server`` owned by the test: its port, its PID, its private HOME."""

    port: int
    home: Path
    process: subprocess.Popen

    def adb(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run the real adb client against this server."""
        return subprocess.run(["adb", "-P", str(self.port), *args], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        stop_process(self.process)


@dataclass
class AdbDevice:
    """A stand-in phone connected to an ``AdbServer``: use ``serial`` with ``adb -s``."""

    serial: str
    port: int
    sandbox: Path  # what the phone calls /data/local/tmp
    server: AdbServer
    process: subprocess.Popen

    def host_path(self, device_path: str) -> Path:
        """Where a phone path under /data/local/tmp really lives on this machine."""
        return Path(str(self.sandbox) + device_path[len(DEVICE_TMP):])

    @property
    def phone(self) -> Phone:
        """The app side of this phone: what it installed, what it answers, the commands it received."""
        return Phone(self.sandbox.parent / "phone")

    def stop(self) -> None:
        self.server.adb("disconnect", self.serial)
        stop_process(self.process)


def start_adb_server(home: Path) -> AdbServer:
    """Start ``adb -P PORT nodaemon server`` in the foreground so the test owns its PID.

    HOME points at a temp dir, so the server's key pair (~/.android/adbkey) is throwaway.
    """
    if not shutil.which("adb"):
        raise RuntimeError("adb not found: apt-get install -y adb")
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "HOME": str(home), "ANDROID_SDK_HOME": str(home)}
    env.pop("ANDROID_SERIAL", None)
    with open(home / "adb-server.log", "wb") as log:
        proc = subprocess.Popen(["adb", "-P", str(port), "nodaemon", "server"], env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
    server = AdbServer(port, home, proc)
    try:
        wait_for_port(port, lambda: proc.poll() is None, "adb server")
    except RuntimeError:
        server.stop()
        raise
    return server


def start_adbd(root: Path, server: AdbServer, *, serial: str = "HYDRA0001", unauthorized: bool = False,
               props: dict[str, str] | None = None) -> AdbDevice:
    """Start the stand-in daemon as its own process and ``adb connect`` the server to it."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    package_root = Path(__file__).resolve().parents[len(__package__.split("."))]
    argv = [sys.executable, "-m", f"{__package__}.adbd", "--port", str(port), "--root", str(root),
            "--serial", serial, *(a for k, v in (props or {}).items() for a in ("--prop", f"{k}={v}"))]
    if unauthorized:
        argv.append("--unauthorized")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(package_root), os.environ.get("PYTHONPATH")]))}
    with open(root / "adbd.log", "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    device = AdbDevice(f"127.0.0.1:{port}", port, root / "sandbox", server, proc)
    try:
        wait_for_port(port, lambda: proc.poll() is None, "adbd stand-in")
        connected = server.adb("connect", device.serial)
        if "connected" not in connected.stdout or "fail" in connected.stdout.lower():
            if not unauthorized:
                raise RuntimeError(f"adb connect {device.serial} failed: {connected.stdout}{connected.stderr}")
        want = "unauthorized" if unauthorized else "device"
        _wait_for_state(server, device.serial, want)
    except BaseException:
        device.stop()
        raise
    return device


def _wait_for_state(server: AdbServer, serial: str, want: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    rows: list[str] = []
    while time.monotonic() < deadline:
        rows = server.adb("devices").stdout.splitlines()[1:]
        if f"{serial}\t{want}" in rows:
            return
        time.sleep(0.1)
    raise RuntimeError(f"{serial} never became {want!r} in `adb devices`: {rows}")


@pytest.fixture(scope="module")
def adb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdbServer]:
    """The test module's own adb server (``adb -P PORT nodaemon server``), stopped by PID."""
    server = start_adb_server(tmp_path_factory.mktemp("adb-home"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def adb_device(adb_server: AdbServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdbDevice]:
    """A connected stand-in phone (state ``device``) for the test module, stopped by PID."""
    device = start_adbd(tmp_path_factory.mktemp("adbd"), adb_server)
    try:
        yield device
    finally:
        device.stop()


if __name__ == "__main__":
    main()
