"""One way to reach a device: run a command, copy files both ways, check what arrived.

Every transport (this machine, ssh, adb) is a local client program that runs one remote shell
command per call, so the shared machinery lives here: quoting an argv for the remote shell,
running the client with timeouts and Ctrl-C handling, streaming output lines, turning client
error text into one-line ``TransportError``s, verifying every copy by sha256 computed on the
device, and checking the ports of a forward to the device's loopback. A subclass only says how to
launch its client, how to copy a file and how to forward a port.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator, Mapping, NamedTuple, Sequence

from ..atomic import atomic_path, sha256_file
from .errors import (
    IntegrityError,
    NoSpaceError,
    RemoteCommandError,
    RemoteFileNotFoundError,
    ToolMissingError,
    TransportError,
    TransportInterrupted,
    TransportTimeout,
)
from .result import Result

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
LOOPBACK = "127.0.0.1"  # both ends of a forward: a page served on the device's loopback, opened on this machine's
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")


class Launch(NamedTuple):
    """How to start the local client process that runs one command on the device."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    install_hint: str = ""  # said when argv[0] is missing here, e.g. "apt-get install adb"


@dataclass(frozen=True)
class ErrorRule:
    """Client error text (a regex) that means a specific, fixable failure.

    ``message`` is formatted with the transport's ``_error_fields()`` plus the regex's named
    groups, so one table per client gives every failure one clear line.
    """

    pattern: str
    error: type[TransportError]
    message: str


def match_error(rules: Sequence[ErrorRule], text: str,
                fields: Callable[[], Mapping[str, object]]) -> TransportError | None:
    """The error for the first rule whose pattern occurs in ``text``, else None. ``fields`` is asked
    for only when a rule matches: for ssh it runs ``ssh -G``, which no unmatched exit should pay."""
    for rule in rules:
        found = re.search(rule.pattern, text, re.IGNORECASE | re.MULTILINE)
        if found:
            return rule.error(rule.message.format(**{**fields(), **found.groupdict()}))
    return None


# File-copy failures look alike across clients (they are the device's errno strings).
TRANSFER_RULES = (
    ErrorRule(r"No space left on device|ENOSPC|disk quota exceeded", NoSpaceError,
              "no space left on {device} for {path}; free some space or choose another remote dir"),
    ErrorRule(r"No such file or directory|does not exist", RemoteFileNotFoundError,
              "{path} does not exist on {device}"),
)


def remote_command(argv: Sequence[str], cwd: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """One POSIX shell command line that runs ``argv`` exactly, every word quoted.

    Remote shells (sh, bash, Android's mksh) re-parse the line, so nothing in an argument
    (spaces, quotes, ``$``, backticks, ``;``) may reach them unquoted.
    """
    line = shlex.join(check_argv(argv))
    if env:
        bad = [k for k in env if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"not an environment variable name: {bad[0]!r}")
        line = "env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " " + line
    if cwd is not None:
        line = f"cd {shlex.quote(_safe_path(cwd))} && {line}"
    return line


_WATCH = 'exec 3<&0; "$@" '  # how ``host_watch``'s code starts: ``shown`` leaves the wrapper out


def host_watch(redirects: str) -> str:
    """sh code that runs ``"$@"`` (with ``redirects``: its stdin at least) until it ends or the host goes.

    sshd and adbd send a device command no signal when the host's client is stopped (Ctrl-C) or
    killed, or when the link drops: they only close its pipes, and a command that is not writing
    (pip resolving, a runtime timing, ``sleep``) would run on unseen. So the host holds the
    command's stdin open for exactly as long as it wants the command to live; the device's sh runs
    the command in the background and a watcher reads that stdin (kept as fd 3): at its end the
    watcher stops the command. The watcher writes nowhere, so it never keeps a channel open; ``$?``
    is the command's status when the code ends.
    """
    return (f'{_WATCH}{redirects} & pid=$!; '
            '{ cat <&3 >/dev/null 2>&1; kill -TERM "$pid" 2>/dev/null; } >/dev/null 2>&1 & '
            'wait "$pid"')


def watched(argv: Sequence[str]) -> list[str]:
    """``argv`` stopped when the host goes (``host_watch``), its own stdin empty, its status kept."""
    return ["sh", "-c", host_watch("</dev/null 3<&-"), "sh", *check_argv(argv)]


def check_argv(argv: Sequence[str]) -> list[str]:
    """Reject a command given as one string: it would be quoted as a single word (or char by char)."""
    if isinstance(argv, (str, bytes)) or not argv:
        raise TypeError("argv must be a non-empty list of strings, e.g. ['ls', '-l', path]")
    return [str(a) for a in argv]


def shown(argv: Sequence[str], limit: int = 120) -> str:
    """A command as a user would type it, cut short for one-line messages; a command run under
    ``host_watch`` is shown without that wrapper, which is this toolkit's doing, not the user's."""
    if len(argv) > 4 and list(argv[:2]) == ["sh", "-c"] and argv[2].startswith(_WATCH):
        argv = argv[4:]
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _safe_path(path: str) -> str:
    """Keep a relative path that starts with '-' from being read as an option."""
    return "./" + path if path.startswith("-") else path


def device_dir(path: str) -> str:
    """A ``--remote-dir`` as every later command can use it: one that starts with '-' gets './'.

    Every other character (spaces, quotes, backslashes, newlines) is kept: commands quote it.
    """
    if not path or "\0" in path:
        raise TransportError(f"cannot use {path!r} as the remote dir: it is empty or holds a NUL byte")
    return _safe_path(path)


_SHA256SUM_ESCAPES = {"\\": "\\", "n": "\n", "r": "\r"}


def parse_sha256sum(output: str) -> dict[str, str]:
    """``{file name: digest}`` from ``sha256sum`` output.

    GNU sha256sum writes a line for a name holding a backslash or a newline as '\\' + digest +
    the name with those escaped; the name is unescaped here so it matches the path asked for.
    """
    found = {}
    for line in output.split("\n"):
        escaped = line.startswith("\\")
        digest, _, name = line[escaped:].partition(" ")
        name = name[1:] if name[:1] in (" ", "*") else name  # "  name" (text) or " *name" (binary)
        if escaped:
            name = re.sub(r"\\(.)", lambda m: _SHA256SUM_ESCAPES.get(m.group(1), m.group(0)), name)
        if _SHA256.match(digest) and name:
            found[name] = digest
    return found


def check_port(port: int, what: str) -> int:
    """``port`` when it is a TCP port a forward can use (1-65535), else one line naming ``what`` it is."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise TransportError(f"{what} {port!r} is not a TCP port; give one from 1 to 65535")
    return port


def port_in_use(port: int) -> TransportError:
    """The one line for this machine's loopback ``port`` taken by something else."""
    return TransportError(f"port {port} on this machine is in use (another program, or an earlier page still "
                          f"forwarded); give another local port, e.g. {port + 1 if port < 65535 else 8765}")


def ensure_free(port: int) -> None:
    """Fail now, in one line, when this machine's 127.0.0.1:``port`` cannot be listened on.

    Bound and released at once, with SO_REUSEADDR as ssh, adb and the live page bind, so a closed
    connection still in TIME_WAIT does not count as in use. Another program can take the port
    between this check and the bind that follows; each forward still reports that in one line.
    """
    try:
        socket.create_server((LOOPBACK, port)).close()
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise port_in_use(port) from None
        if e.errno == errno.EACCES:
            raise TransportError(f"port {port} on this machine needs root (below 1024); give a local port "
                                 "from 1024, e.g. 8765") from None
        raise TransportError(f"cannot listen on this machine's {LOOPBACK}:{port}: {e.strerror or e}") from None


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _stop(proc: subprocess.Popen) -> None:
    """Stop a client process and whatever it started, and reap it.

    Clients run in their own process group (so Ctrl-C reaches only us, and we decide how to
    stop); the remote side sees its connection close.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


class Transport(ABC):
    """A device reachable by one client program; thread-safe per instance.

    Each call starts its own client process and shares no mutable state, so a fleet can drive
    several transports (or one) from threads. Remote paths are POSIX paths on the device;
    ``base_dir`` is where this toolkit keeps its files there.
    """

    device_id: str  # e.g. "ssh:pi@10.0.0.7:22", "adb:R58M12345", "local:myhost"
    base_dir: str

    def __init__(self) -> None:
        self._clients: set[subprocess.Popen] = set()  # running client processes, stopped by close()
        self._clients_lock = threading.Lock()
        self._closed = False

    def __str__(self) -> str:
        return self.device_id

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what a subclass provides -------------------------------------------------------

    @abstractmethod
    def _launch(self, argv: list[str], cwd: str | None, env: Mapping[str, str] | None) -> Launch:
        """The local process that runs ``argv`` on the device."""

    def _client_error(self, returncode: int, stderr: str) -> TransportError | None:
        """A failure of the client itself (connection, auth), told apart from the command's own."""
        return None

    def _error_fields(self) -> dict[str, object]:
        """Values the error-rule messages may name ({device}, {host}, {port}, ...)."""
        return {"device": self.device_id}

    def connect(self) -> None:
        """Fail now, with a clear message, if the device cannot be reached."""
        self.run(["true"])

    def close(self) -> None:
        """Stop every command still running through this transport; later calls are refused.

        From any thread: a fleet interrupted by Ctrl-C closes each device's transport so that the
        worker threads' commands end now, on every kind of device. Subclasses then release their
        connections and temp files; the device's files stay.
        """
        with self._clients_lock:
            self._closed = True
            running = list(self._clients)
        for proc in running:
            _stop(proc)

    def _upload(self, local: Path, remote: str) -> None:
        """Copy a file to the device (default: stream it into ``cat`` over the command channel)."""
        with open(local, "rb") as src:
            rc, _, err = self._execute(["sh", "-c", 'cat > "$1"', "sh", remote], stdin=src)
        if rc != 0:
            raise self._transfer_error(err, remote, f"copying {local} to")

    def _download(self, remote: str, local: Path) -> None:
        """Copy a file from the device (default: ``cat`` it into the local file)."""
        with open(local, "wb") as dst:
            rc, _, err = self._execute(["cat", _safe_path(remote)], stdout=dst)
        if rc != 0:
            raise self._transfer_error(err, remote, "copying from")

    # --- commands -------------------------------------------------------------------------

    def run(self, argv: Sequence[str], timeout: float | None = None, check: bool = True,
            cwd: str | None = None, env: Mapping[str, str] | None = None) -> Result:
        """Run ``argv`` on the device and wait; with ``check`` a non-zero exit raises.

        ``cwd`` is a device directory to run in; ``env`` adds environment variables.
        """
        argv = check_argv(argv)
        rc, out, err = self._execute(argv, cwd=cwd, env=env, timeout=timeout)
        result = Result(rc, out.decode(errors="replace"), err)
        if check and rc != 0:
            raise self._command_failed(argv, result)
        return result

    def stream(self, argv: Sequence[str], timeout: float | None = None, check: bool = True,
               cwd: str | None = None, env: Mapping[str, str] | None = None,
               on_stderr: Callable[[str], None] | None = None) -> "Stream":
        """Start ``argv`` on the device; iterate the returned ``Stream`` for stdout lines as they come.

        For long runs (the calibration runner prints one JSON line per measurement). ``timeout`` is
        an idle limit: the command is stopped when it prints nothing for that long (a hung runtime),
        however long it runs in all. Use it as a context manager so leaving early stops the command.
        ``on_stderr`` gets each stderr line as it arrives (from another thread), e.g. for a log.
        """
        argv = check_argv(argv)
        # The command's stdin stays open, empty, until the stream ends: a device command run under
        # ``host_watch`` (``measure.exits.reporting_exit``) stops when this process is stopped or killed.
        proc = self._popen(self._launch(argv, cwd, env), subprocess.PIPE, subprocess.PIPE)
        return Stream(self, argv, proc, timeout, check, on_stderr)

    def _popen(self, launch: Launch, stdin: int | IO[bytes], stdout: int | IO[bytes],
               stderr: int | IO[bytes] = subprocess.PIPE) -> subprocess.Popen:
        with self._clients_lock:
            if self._closed:
                raise TransportInterrupted(f"interrupted: the connection to {self.device_id} was closed")
            try:
                proc = subprocess.Popen(launch.argv, cwd=launch.cwd, env=launch.env,
                                        stdin=stdin, stdout=stdout, stderr=stderr,
                                        start_new_session=True)
            except FileNotFoundError:
                raise ToolMissingError(f"`{launch.argv[0]}` is not installed on this machine; "
                                       f"{launch.install_hint}") from None
            self._clients.add(proc)
        return proc

    def _released(self, proc: subprocess.Popen) -> None:
        """A client process has ended; ``close`` no longer needs to stop it."""
        with self._clients_lock:
            self._clients.discard(proc)

    def _execute(self, argv: list[str], cwd: str | None = None, env: Mapping[str, str] | None = None,
                 timeout: float | None = None, stdin: int | IO[bytes] = subprocess.DEVNULL,
                 stdout: int | IO[bytes] = subprocess.PIPE) -> tuple[int, bytes, str]:
        """Run one device command to the end: (exit code, stdout bytes, stderr text).

        A command that is sent nothing gets, instead of an empty stdin, one this process holds open
        until the command ends, and runs ``watched``: if this process is stopped or killed, or the
        link drops, while it waits (a long ``pip install`` during ``--setup``), the device stops the
        command too instead of running it to its end.
        """
        if stdin is not subprocess.DEVNULL:  # it reads what is sent, and ends when that does
            return self._run_client(self._launch(argv, cwd, env), argv, timeout, stdin, stdout)
        held, hold = os.pipe()  # nothing is ever written to ``hold``; its closing is the message
        try:
            return self._run_client(self._launch(watched(argv), cwd, env), argv, timeout, held, stdout)
        finally:
            os.close(held)
            os.close(hold)

    def _run_client(self, launch: Launch, argv: Sequence[str], timeout: float | None = None,
                    stdin: int | IO[bytes] = subprocess.DEVNULL,
                    stdout: int | IO[bytes] = subprocess.PIPE) -> tuple[int, bytes, str]:
        """Run a client process to the end; ``argv`` names what it does in messages."""
        proc = self._popen(launch, stdin, stdout)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise TransportTimeout(f"`{shown(argv)}` did not finish within {timeout:g} s on "
                                   f"{self.device_id}; stopped it") from None
        except KeyboardInterrupt:
            _stop(proc)
            raise TransportInterrupted(f"interrupted while `{shown(argv)}` ran on {self.device_id}") from None
        finally:
            self._released(proc)
        if self._closed:
            raise TransportInterrupted(f"interrupted while `{shown(argv)}` ran on {self.device_id}")
        err_text = err.decode(errors="replace")
        failure = self._client_error(proc.returncode, err_text)
        if failure is not None:
            raise failure
        return proc.returncode, out or b"", err_text

    def _command_failed(self, argv: Sequence[str], result: Result) -> RemoteCommandError:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        detail = f": {said[-1]}" if said else ""
        return RemoteCommandError(f"`{shown(argv)}` exited with {result.returncode} on "
                                  f"{self.device_id}{detail}", result)

    def _transfer_error(self, stderr: str, path: str, doing: str) -> TransportError:
        found = match_error(TRANSFER_RULES, stderr, lambda: {**self._error_fields(), "path": path})
        if found is not None:
            return found
        lines = stderr.strip().splitlines()
        return TransportError(f"{doing} {path} on {self.device_id} failed: "
                              f"{lines[-1] if lines else 'no error text'}")

    # --- ports ----------------------------------------------------------------------------

    @contextmanager
    def forward(self, remote_port: int, local_port: int | None = None) -> Iterator[int]:
        """While the block runs, this machine's 127.0.0.1:``local_port`` reaches the device's
        127.0.0.1:``remote_port``; yields the local port to open (``remote_port`` when none is given).

        For what a device serves on its loopback only (the board app's live page): nothing on the
        device is opened to its network, and the link is the transport's own (ssh with its host-key
        checking, the adb server). Both ports are checked, and the local one is checked free, before
        anything starts; leaving the block (an exception, Ctrl-C) or ``close()`` tears the forward down.
        """
        check_port(remote_port, "the device's port")
        local_port = check_port(remote_port if local_port is None else local_port, "the local port")
        ensure_free(local_port)
        with self._forwarding(remote_port, local_port):
            yield local_port

    def _forwarding(self, remote_port: int, local_port: int) -> AbstractContextManager[None]:
        """Make the forward ``forward`` describes (its ports checked); undo it on leaving."""
        raise TransportError(f"{self.device_id} cannot forward a port")

    def _forward_failed(self, returncode: int, said: str, bind_failed: re.Pattern[str], local_port: int,
                        remote_port: int, client: str) -> TransportError:
        """The one line for a forward's client that failed: the local port taken (its own words for it,
        ``bind_failed``), the client's known errors, else its last line."""
        if bind_failed.search(said):
            return port_in_use(local_port)
        lines = said.strip().splitlines()
        return self._client_error(returncode, said) or TransportError(
            f"{client} forward of port {remote_port} on {self.device_id} ended with exit {returncode}: "
            f"{lines[-1] if lines else 'no error text'}")

    @contextmanager
    def _hold_client(self, launch: Launch, ready: str, timeout: float,
                     failed: Callable[[int, str], TransportError]) -> Iterator[None]:
        """A client process that runs for the caller's block (``ssh -N -L``): started, ready once its
        stderr holds ``ready``, stopped by its process group on leaving (or by ``close()``).

        Its stderr goes to a file: a pipe nobody reads would stall it once full. A client that ends
        before it is ready raises ``failed(exit code, stderr)``; one that takes over ``timeout``
        seconds is stopped.
        """
        with tempfile.TemporaryFile() as err:
            proc = self._popen(launch, subprocess.DEVNULL, subprocess.DEVNULL, err)
            try:
                deadline = time.monotonic() + timeout
                while True:
                    err.seek(0)
                    said = err.read().decode(errors="replace")
                    if ready in said:
                        break
                    if proc.poll() is not None:
                        raise failed(proc.returncode, said)
                    if time.monotonic() > deadline:
                        raise TransportTimeout(f"`{shown(launch.argv)}` was not ready within {timeout:g} s; "
                                               "stopped it")
                    time.sleep(0.05)
                yield
            finally:
                _stop(proc)
                self._released(proc)

    # --- files ----------------------------------------------------------------------------

    def remote_path(self, *parts: str) -> str:
        """A path under ``base_dir`` on the device."""
        return posixpath.join(self.base_dir, *parts)

    def exists(self, remote: str) -> bool:
        return self.run(["test", "-e", _safe_path(remote)], check=False).returncode == 0

    def mkdir(self, remote: str) -> None:
        """Create a device directory and its parents (no error if it exists)."""
        self.run(["mkdir", "-p", _safe_path(remote)])

    def free_bytes(self, remote_dir: str) -> int:
        """Bytes available to us in the file system holding ``remote_dir``."""
        result = self.run(["df", "-Pk", _safe_path(remote_dir)])
        # POSIX format: FS, 1024-blocks, Used, Available, Capacity%, Mounted on; names may hold spaces,
        # so anchor on the Capacity column.
        fields = result.stdout.strip().splitlines()[-1].split()
        for i, field in enumerate(fields):
            if i >= 1 and field.endswith("%") and fields[i - 1].isdigit():
                return int(fields[i - 1]) * 1024
        raise TransportError(f"cannot read free space of {remote_dir} on {self.device_id} "
                             f"from `df -Pk`: {result.stdout.strip()!r}")

    def sha256(self, remote: str) -> str:
        """sha256 of a device file, computed on the device (``sha256sum``, or toybox's on Android)."""
        result = None
        for tool in (["sha256sum"], ["toybox", "sha256sum"]):
            result = self.run([*tool, "--", remote], check=False)
            digests = list(parse_sha256sum(result.stdout).values())
            if result.returncode == 0 and len(digests) == 1:
                return digests[0]
            if result.returncode not in (126, 127):  # the tool exists and failed: say why
                break
        raise self._transfer_error(result.stderr if result else "", remote, "hashing")

    def push(self, local: str | Path, remote: str) -> None:
        """Copy a local file to ``remote`` (parents created) and prove it arrived intact.

        The file lands beside its target under a temporary name, its sha256 is computed on the
        device and compared, and only then is it renamed into place; a bad copy is removed and
        raises ``IntegrityError``, so the device never holds a half or corrupted file by its
        real name.
        """
        local = Path(local)
        if not local.is_file():
            raise TransportError(f"cannot push {local}: not a file on this machine")
        want, size = sha256_file(local), local.stat().st_size
        parent, name = posixpath.split(remote)
        parent = parent or "."
        self.mkdir(parent)
        free = self.free_bytes(parent)
        if size > free:
            raise NoSpaceError(f"no space on {self.device_id} for {remote}: it needs {_mib(size)}, "
                               f"{parent} has {_mib(free)} free; free some space or choose another remote dir")
        part = posixpath.join(parent, f".{name}.hydra-part")
        try:
            self._upload(local, part)
            got = self.sha256(part)
            if got != want:
                raise IntegrityError(f"pushing {local} to {remote} on {self.device_id} corrupted it "
                                     f"(sha256 {got[:12]}... on the device, {want[:12]}... here); push again")
            self.run(["mv", "-f", _safe_path(part), _safe_path(remote)])
        except BaseException:
            self._discard(part)
            raise

    def pull(self, remote: str, local: str | Path) -> Path:
        """Copy a device file here atomically, checked against the device's sha256."""
        local = Path(local)
        with atomic_path(local) as tmp:
            self._download(remote, tmp)
            want, got = self.sha256(remote), sha256_file(tmp)
            if got != want:
                raise IntegrityError(f"pulling {remote} from {self.device_id} corrupted it "
                                     f"(sha256 {want[:12]}... there, {got[:12]}... here); pull again")
        return local

    def _discard(self, remote: str) -> None:
        """Best-effort removal after a failed push; the original failure is what matters."""
        try:
            self.run(["rm", "-f", _safe_path(remote)], check=False, timeout=30)
        except TransportError:
            pass


class Stream:
    """Stdout lines of a running device command, yielded as they arrive.

    After the loop ends, ``returncode`` and ``stderr`` hold the outcome; with ``check`` a
    non-zero exit raises ``RemoteCommandError``, a dropped connection the transport's error,
    Ctrl-C ``TransportInterrupted``. Leaving a ``with`` block early stops the command; stopping
    never waits on the device (an ssh master may hold the pipes of a command that runs on).
    """

    def __init__(self, transport: Transport, argv: list[str], proc: subprocess.Popen,
                 timeout: float | None, check: bool, on_stderr: Callable[[str], None] | None = None) -> None:
        self.returncode: int | None = None
        self.stderr = ""
        self._transport, self._argv, self._proc, self._check = transport, argv, proc, check
        self._on_stderr = on_stderr
        self._err_chunks: list[bytes] = []
        self._err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_reader.start()  # a full stderr pipe would otherwise stall the command
        self._timed_out = threading.Event()
        self._timeout = timeout
        self._timer: threading.Timer | None = None
        self._arm()

    def _arm(self) -> None:
        """(Re)start the idle timer: each line of output buys the command another ``timeout``."""
        if self._timer:
            self._timer.cancel()
        if self._timeout is not None:
            self._timer = threading.Timer(self._timeout, self._time_out)
            self._timer.daemon = True
            self._timer.start()

    def _read_stderr(self) -> None:
        """Collect stderr until its end, handing each line to ``on_stderr``; the pipe is this thread's
        to close (see ``close``)."""
        pipe = self._proc.stderr
        assert pipe is not None
        partial = b""
        with pipe:
            for chunk in iter(lambda: pipe.read1(65536), b""):
                self._err_chunks.append(chunk)
                if self._on_stderr:
                    *lines, partial = (partial + chunk).split(b"\n")
                    for line in lines:
                        self._on_stderr(line.decode(errors="replace").rstrip("\r"))
        if self._on_stderr and partial:
            self._on_stderr(partial.decode(errors="replace").rstrip("\r"))

    def _time_out(self) -> None:
        self._timed_out.set()
        _stop(self._proc)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[str]:
        assert self._proc.stdout is not None
        try:
            for raw in self._proc.stdout:
                self._arm()
                yield raw.decode(errors="replace").rstrip("\r\n")
            self._proc.wait()
        except KeyboardInterrupt:
            self.close()
            raise TransportInterrupted(f"interrupted while `{shown(self._argv)}` ran on "
                                       f"{self._transport.device_id}") from None
        self._finish()

    def _finish(self) -> None:
        self.close()
        if self._timed_out.is_set():
            raise TransportTimeout(f"`{shown(self._argv)}` printed nothing for {self._timeout:g} s on "
                                   f"{self._transport.device_id} (hung?); stopped it")
        if self._transport._closed:
            raise TransportInterrupted(f"interrupted while `{shown(self._argv)}` ran on {self._transport.device_id}")
        rc = self._proc.returncode
        failure = self._transport._client_error(rc, self.stderr)
        if failure is not None:
            raise failure
        self.returncode = rc
        if self._check and rc != 0:
            raise self._transport._command_failed(self._argv, Result(rc, "", self.stderr))

    def close(self) -> None:
        """Stop the command if it still runs and collect what it wrote to stderr.

        Closing the command's stdin tells a device program that watches it to stop; stopping the
        client ends it everywhere else. The stderr reader gets a moment to drain, but is not
        waited for: a device command that ignores both keeps its pipe open until it ends.
        """
        if self._timer:
            self._timer.cancel()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe:
                try:
                    pipe.close()
                except OSError:
                    pass  # the client already went, taking the pipe's other end with it
        _stop(self._proc)
        self._transport._released(self._proc)
        self._err_reader.join(timeout=2)
        self.stderr = b"".join(self._err_chunks).decode(errors="replace")
