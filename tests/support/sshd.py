"""A real OpenSSH server on 127.0.0.1, standing in for a Linux board.

It runs as the current user (root in CI) with a throwaway host key and client key in a temp
dir. The client side gets a known_hosts file and an ssh config naming the server, so host-key
checking stays on exactly as it would against a real board.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from .processes import free_port, stop_process, wait_for_port

ALIAS = "hydra-test-board"


@dataclass
class SshServer:
    """What a client needs to reach the stand-in board, and the handle to stop it."""

    host: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path
    ssh_config: Path  # defines Host ALIAS with every setting above
    alias: str
    root: Path
    process: subprocess.Popen

    @property
    def spec(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def options(self) -> dict[str, object]:
        """Keyword options for ``open_transport`` that reach this server by ``spec``."""
        return {"identity_file": self.identity_file, "known_hosts": self.known_hosts}

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.process)


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hydra-test", "-f", str(path)],
                   check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


def start_sshd(root: Path) -> SshServer:
    """Start ``sshd -D -e -f CONFIG`` on a free loopback port; return once it accepts."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        raise RuntimeError("sshd not found: apt-get install -y openssh-server openssh-client")
    root.mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation dir
    host_pub = _keygen(root / "host_ed25519")
    client_pub = _keygen(root / "client_ed25519")
    (root / "authorized_keys").write_text(client_pub + "\n")
    port = free_port()
    config = root / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {root / 'host_ed25519'}\n"
        f"AuthorizedKeysFile {root / 'authorized_keys'}\nPidFile {root / 'sshd.pid'}\n"
        "UsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\nPermitRootLogin prohibit-password\n"
        "Subsystem sftp internal-sftp\nLogLevel VERBOSE\n"
    )
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {' '.join(host_pub.split()[:2])}\n")
    user = getpass.getuser()
    identity = root / "client_ed25519"
    ssh_config = root / "ssh_config"
    ssh_config.write_text(
        f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n"
        f"  IdentityFile {identity}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n"
    )
    with open(root / "sshd.log", "wb") as log:
        proc = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)
    server = SshServer("127.0.0.1", port, user, identity, known_hosts, ssh_config, ALIAS, root, proc)
    try:
        wait_for_port(port, lambda: proc.poll() is None, "sshd")
    except RuntimeError as e:
        server.stop()
        raise RuntimeError(f"{e}\n{server.log()}") from None
    return server


@pytest.fixture(scope="module")
def sshd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A running stand-in board for the whole test module; stopped by PID afterwards."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()
