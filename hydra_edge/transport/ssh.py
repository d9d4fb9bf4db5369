"""A Linux board over ssh, through the real OpenSSH client.

The real client is used (not a Python ssh library) so that the user's ~/.ssh/config aliases,
keys, agents, jump hosts and known_hosts behave exactly as they do by hand. Host-key checking
stays strict and batch mode stays on: a calibration run must never hang on a prompt or trust
a board it has not seen. One master connection per transport (ControlMaster, in a private
temp dir) makes each later command cost one round trip instead of a handshake.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator, Mapping

from .base import LOOPBACK, ErrorRule, Launch, Transport, device_dir, match_error, remote_command
from .errors import (
    AuthenticationError,
    ConnectionLostError,
    HostKeyError,
    ToolMissingError,
    TransportError,
    UnreachableError,
)

SSH_EXIT_ERROR = 255  # ssh's own failures; a remote command's exit code passes through otherwise
MASTER_IDLE_S = 120  # a master left behind by a crashed run exits on its own after this
FORWARD_START_S = 60.0  # logging in and binding the local end of ``ssh -N -L``, beyond the connect timeout
# What ssh -v says once every -L is set up (ssh 9.2 says "Local forwarding listening" before it binds: too early)
FORWARD_READY = "Entering interactive session."
# What ssh says when the local end of a forward cannot be bound (ExitOnForwardFailure makes it exit)
FORWARD_BIND_FAILED = re.compile(r"Address already in use|cannot listen to port|Could not request local forwarding")

SSH_RULES = (
    ErrorRule(r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key .* has changed", HostKeyError,
              "the ssh host key of {host} has CHANGED (a reinstalled board, or someone in between); "
              "if expected, run `ssh-keygen -R {keyhost} -f {known_hosts}` then add the new key with "
              "`ssh-keyscan -p {port} {hostname} >> {known_hosts}`"),
    ErrorRule(r"Host key verification failed|host key is known for|no .* host key is known", HostKeyError,
              "the ssh host key of {host} is not in known_hosts; after checking its fingerprint add it "
              "with `ssh-keyscan -p {port} {hostname} >> {known_hosts}` or connect once by hand with `{by_hand}`"),
    ErrorRule(r"Permission denied \((?P<methods>[^)]*)\)|Too many authentication failures|"
              r"(?P<bad>remote username contains invalid characters)", AuthenticationError,
              "{device} refused to log in as {user!r}; check the user name, identity file and "
              "authorized_keys on the board"),
    ErrorRule(r"Could not resolve hostname", UnreachableError,
              "cannot resolve the host name {host!r}; check the spelling or your ssh config"),
    ErrorRule(r"Connection refused", UnreachableError,
              "{host} refused the connection on port {port}; is sshd running there and is the port right?"),
    ErrorRule(r"connect to host .*(timed out|No route to host|Network is unreachable)|"
              r"Connection timed out during banner exchange|Operation timed out", UnreachableError,
              "cannot reach {host} on port {port} (timed out or no route); is the board on and on this network?"),
    ErrorRule(r"closed by remote host|Connection reset|Broken pipe|not responding|Connection closed by",
              ConnectionLostError, "the ssh connection to {device} dropped"),
)


@dataclass(frozen=True)
class SshTarget:
    """Who and where: ``user@host:port`` split up; ``user``/``port`` None leave it to ssh config."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = f"{self.user}@{host}" if self.user else host
        return f"{text}:{self.port}" if self.port else text


def parse_target(spec: str, port: int | None = None) -> SshTarget:
    """Read ``user@host[:port]``, ``[v6addr]:port`` or a bare ssh-config alias.

    The user is everything before the last '@', so odd user names survive; it is handed to
    ssh as its own argument and never pasted into a command line.
    """
    user, at, rest = spec.rpartition("@")
    bracketed = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", rest)
    if bracketed:
        host, found_port = bracketed.group(1), bracketed.group(2)
    elif rest.count(":") == 1:
        host, found_port = rest.split(":")
    else:
        host, found_port = rest, None
    if not host or (found_port is not None and not found_port.isdigit()) or (at and not user):
        raise UnreachableError(f"cannot read ssh target {spec!r}; expected user@host[:port] or an ssh config alias")
    return SshTarget(host, user or None, int(found_port) if found_port else port)


def _ssh_value(path: str | Path) -> str:
    """A file path as an ssh ``-o`` value: '%' is a token there, and spaces need quotes."""
    text = str(path).replace("%", "%%")
    return f'"{text}"' if " " in text else text


class SshTransport(Transport):
    """A board reached by ``ssh``; each command is one quoted shell line on the board."""

    def __init__(self, spec: str, *, port: int | None = None, identity_file: str | Path | None = None,
                 known_hosts: str | Path | None = None, ssh_config: str | Path | None = None,
                 connect_timeout: float = 10.0, remote_dir: str = "hydra-edge",
                 reuse_connection: bool = True, ssh: str = "ssh") -> None:
        super().__init__()
        self.target = parse_target(spec, port)
        self.device_id = f"ssh:{self.target}"
        self.base_dir = device_dir(remote_dir)  # relative: in the login user's home, where ssh commands start
        options = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                   "-o", f"ConnectTimeout={max(1, round(connect_timeout))}",
                   "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        if ssh_config is not None:
            options = ["-F", str(ssh_config), *options]
        if identity_file is not None:
            options += ["-o", f"IdentityFile={_ssh_value(identity_file)}", "-o", "IdentitiesOnly=yes"]
        if known_hosts is not None:
            options += ["-o", f"UserKnownHostsFile={_ssh_value(known_hosts)}"]
        if self.target.port is not None:
            options += ["-p", str(self.target.port)]
        if self.target.user is not None:
            options += ["-l", self.target.user]
        self._ssh = ssh
        self._known_hosts, self._ssh_config = known_hosts, ssh_config  # named in host-key messages
        self._control_dir = tempfile.mkdtemp(prefix="hydra-ssh-") if reuse_connection else None
        self._options = options  # every ssh this transport starts; the shared connection's path is added below
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()  # one master start at a time

    def _ssh_argv(self, *extra: str) -> list[str]:
        """An ssh command line with the transport's options and its shared connection (when reused)."""
        shared = ["-o", f"ControlPath={_ssh_value(Path(self._control_dir) / '%C')}"] if self._control_dir else []
        return [self._ssh, *self._options, *shared, *extra]

    def _launch(self, argv: list[str], cwd: str | None, env: Mapping[str, str] | None) -> Launch:
        # ControlMaster=no: use the master if it is up, else connect directly; never become one,
        # since a backgrounded master would hold this call's pipes open.
        mux = ["-o", "ControlMaster=no"] if self._control_dir else []
        return Launch(self._ssh_argv(*mux, "-T", "--", self.target.host, remote_command(argv, cwd, env)),
                      install_hint="install openssh-client (apt-get install openssh-client)")

    def _error_fields(self) -> dict[str, object]:
        """Message values; those pasted into suggested commands are shell-quoted and come from
        ``ssh -G`` (the host name, port and known_hosts file ssh really uses, aliases resolved)."""
        real = self._resolved()
        hostname = real.get("hostname") or self.target.host
        port = int(real.get("port") or self.target.port or 22)
        files = re.split(r"\s+(?=[/~])", real.get("userknownhostsfile", "").strip())  # as ssh -G lists them
        known_hosts = str(self._known_hosts or files[0] or os.path.expanduser("~/.ssh/known_hosts"))
        by_hand = [self._ssh, *(["-F", str(self._ssh_config)] if self._ssh_config else []),
                   *(["-o", f"UserKnownHostsFile={_ssh_value(known_hosts)}"] if self._known_hosts else []),
                   *(["-p", str(self.target.port)] if self.target.port else []),
                   *(["-l", self.target.user] if self.target.user else []), self.target.host]
        return {"device": self.device_id, "host": self.target.host, "port": port,
                "user": self.target.user or "(from ssh config)", "hostname": shlex.quote(hostname),
                "known_hosts": shlex.quote(known_hosts), "by_hand": shlex.join(by_hand),
                "keyhost": shlex.quote(hostname if port == 22 else f"[{hostname}]:{port}")}

    def _resolved(self) -> dict[str, str]:
        """``ssh -G``'s view of the target after every config file: {option: value}, or {} if it fails."""
        try:
            out = subprocess.run(self._ssh_argv("-G", "--", self.target.host), stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=15).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
        return dict(line.partition(" ")[::2] for line in out.splitlines())

    def _client_error(self, returncode: int, stderr: str) -> TransportError | None:
        if returncode != SSH_EXIT_ERROR:
            return None
        found = match_error(SSH_RULES, stderr, self._error_fields)
        if found is None and not stderr.strip():
            # a shared (mux) connection whose master died leaves its client exiting 255 without a word
            return ConnectionLostError(f"the ssh connection to {self.device_id} dropped")
        return found

    def connect(self) -> None:
        """Log in once (starting the shared master connection) so failures surface here."""
        if not self._control_dir:
            return super().connect()
        with self._lock, tempfile.TemporaryFile() as err:
            # The master forks into the background and keeps its stderr; a file, unlike a pipe,
            # lets us read what the foreground said without waiting for the master to exit.
            argv = self._ssh_argv("-o", "ControlMaster=auto", "-o", f"ControlPersist={MASTER_IDLE_S}",
                                  "-T", "--", self.target.host, "true")
            rc = self._start_master(argv, err)
            err.seek(0)
            text = err.read().decode(errors="replace")
        failure = self._client_error(rc, text)
        if failure is not None:
            raise failure
        if rc != 0:
            raise UnreachableError(f"cannot log in to {self.device_id}: {text.strip() or f'ssh exited {rc}'}")

    def _start_master(self, argv: list[str], err: IO[bytes]) -> int:
        try:
            return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=err, timeout=120).returncode
        except FileNotFoundError:
            raise ToolMissingError(f"`{self._ssh}` is not installed on this machine; "
                                   "install openssh-client (apt-get install openssh-client)") from None
        except subprocess.TimeoutExpired:
            raise UnreachableError(f"logging in to {self.device_id} took over 120 s; giving up") from None

    @contextmanager
    def _forwarding(self, remote_port: int, local_port: int) -> Iterator[None]:
        """``ssh -N -L 127.0.0.1:LOCAL:127.0.0.1:REMOTE``, a connection of its own, stopped by its PID.

        The same options as every command (batch mode, strict host-key checking, the user's keys and
        config) plus ExitOnForwardFailure, so a local port taken after ``ensure_free`` ends ssh rather
        than leaving it running unforwarded. Not through the shared connection (nor a master the
        user's config names): a forward given to a master outlives this process and is not stopped
        by stopping it. Ready when ssh says (``-v``) its forwards are set up, not when the port accepts:
        a program that took the port since the check must not pass for the forward.
        """
        argv = [self._ssh, *self._options, "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-o", "ExitOnForwardFailure=yes", "-v", "-N", "-T",
                "-L", f"{LOOPBACK}:{local_port}:{LOOPBACK}:{remote_port}", "--", self.target.host]

        def failed(returncode: int, stderr: str) -> TransportError:
            said = "\n".join(line for line in stderr.splitlines() if not line.startswith("debug"))
            return self._forward_failed(returncode, said, FORWARD_BIND_FAILED, local_port, remote_port, "the ssh")

        launch = Launch(argv, install_hint="install openssh-client (apt-get install openssh-client)")
        with self._hold_client(launch, FORWARD_READY, self._connect_timeout + FORWARD_START_S, failed):
            yield

    def close(self) -> None:
        """Stop running commands and the master connection, and remove its socket dir."""
        super().close()
        if not self._control_dir:
            return
        try:
            subprocess.run(self._ssh_argv("-O", "exit", "--", self.target.host), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass  # no master (never connected) or no ssh: nothing to stop
        shutil.rmtree(self._control_dir, ignore_errors=True)
        self._control_dir = None
