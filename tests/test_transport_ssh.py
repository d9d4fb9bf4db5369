"""ssh specifics against a real sshd: host keys stay checked, failures say what to do."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from support.processes import free_port
from support.sshd import SshServer

from hydra_edge.transport import (
    AuthenticationError,
    HostKeyError,
    SshTransport,
    UnreachableError,
    open_transport,
)
from hydra_edge.transport.ssh import SshTarget, parse_target

pytestmark = pytest.mark.slow  # drives a real sshd


def test_an_ssh_config_alias_works_as_the_user_set_it_up(sshd_server: SshServer) -> None:
    with open_transport(host=sshd_server.alias, ssh_config=sshd_server.ssh_config) as t:
        assert t.run(["id", "-un"]).stdout.strip() == sshd_server.user
        assert t.device_id == f"ssh:{sshd_server.alias}"


def test_unknown_host_key_fails_with_how_to_add_it(sshd_server: SshServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError) as info:
        open_transport(host=sshd_server.spec, identity_file=sshd_server.identity_file, known_hosts=empty)
    message = str(info.value)
    assert "\n" not in message
    assert f"ssh-keyscan -p {sshd_server.port} 127.0.0.1 >> {empty}" in message
    assert "connect once by hand" in message
    assert empty.read_text() == ""  # nothing was trusted on our behalf


def test_changed_host_key_is_refused(sshd_server: SshServer, tmp_path: Path) -> None:
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd_server.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    with pytest.raises(HostKeyError, match="CHANGED.*ssh-keygen -R"):
        open_transport(host=sshd_server.spec, identity_file=sshd_server.identity_file, known_hosts=wrong)


def test_a_closed_port_fails_clearly() -> None:
    port = free_port()
    with pytest.raises(UnreachableError, match=f"refused the connection on port {port}"):
        open_transport(host=f"root@127.0.0.1:{port}")


def test_odd_user_names_are_passed_as_data(sshd_server: SshServer, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    user = f"we ird;touch {marker};$(touch {marker})`touch {marker}`'\""
    with pytest.raises(AuthenticationError, match="refused to log in") as info:
        open_transport(host=f"{user}@127.0.0.1:{sshd_server.port}", **sshd_server.options)
    assert "\n" not in str(info.value)
    assert not marker.exists()


def test_close_stops_the_shared_connection(sshd_server: SshServer) -> None:
    t = open_transport(host=sshd_server.spec, **sshd_server.options)
    control_dir = Path(t._control_dir)
    assert any(control_dir.iterdir())  # the master's socket
    t.close()
    assert not control_dir.exists()


def test_without_connection_reuse_each_command_logs_in(sshd_server: SshServer) -> None:
    with SshTransport(sshd_server.spec, reuse_connection=False, **sshd_server.options) as t:
        t.connect()
        assert t.run(["echo", "plain"]).stdout == "plain\n"


@pytest.mark.parametrize("spec, target", [
    ("pi@10.0.0.7", SshTarget("10.0.0.7", "pi", None)),
    ("pi@10.0.0.7:2222", SshTarget("10.0.0.7", "pi", 2222)),
    ("my-board", SshTarget("my-board", None, None)),
    ("a@b@host:22", SshTarget("host", "a@b", 22)),
    ("root@[fe80::1]:2200", SshTarget("fe80::1", "root", 2200)),
    ("fe80::1", SshTarget("fe80::1", None, None)),
])
def test_parse_target(spec: str, target: SshTarget) -> None:
    assert parse_target(spec) == target


@pytest.mark.parametrize("spec", ["", "@host", "user@host:port", "user@"])
def test_unreadable_targets_are_user_errors(spec: str) -> None:
    with pytest.raises(UnreachableError, match="cannot read ssh target"):
        parse_target(spec)


def test_host_key_hints_name_what_ssh_really_uses_and_can_be_pasted(sshd_server: SshServer, tmp_path: Path) -> None:
    """An ssh-config alias: the hint names its real host name, port and known_hosts file (from
    ``ssh -G``, not the alias), quoted; pasted into a shell as it is, it makes the next try work."""
    known_hosts = tmp_path / "board keys; it's here" / "known_hosts"
    known_hosts.parent.mkdir()
    known_hosts.write_text("")
    config = tmp_path / "ssh_config"
    config.write_text(sshd_server.ssh_config.read_text().replace(
        f"UserKnownHostsFile {sshd_server.known_hosts}", f'UserKnownHostsFile "{known_hosts}"'))
    with pytest.raises(HostKeyError) as info:
        open_transport(host=sshd_server.alias, ssh_config=config)
    message = str(info.value)
    keyscan = f"ssh-keyscan -p {sshd_server.port} 127.0.0.1 >> {shlex.quote(str(known_hosts))}"
    assert keyscan in message and f"`ssh -F {config} {sshd_server.alias}`" in message
    assert subprocess.run(["sh", "-c", keyscan], capture_output=True).returncode == 0
    with open_transport(host=sshd_server.alias, ssh_config=config) as t:
        assert t.run(["echo", "trusted"]).stdout == "trusted\n"

    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known_hosts.write_text(f"[127.0.0.1]:{sshd_server.port} {' '.join(other.with_suffix('.pub').read_text().split()[:2])}\n")
    with pytest.raises(HostKeyError) as info:
        open_transport(host=sshd_server.alias, ssh_config=config)
    forget = f"ssh-keygen -R '[127.0.0.1]:{sshd_server.port}' -f {shlex.quote(str(known_hosts))}"
    assert forget in str(info.value)
    assert subprocess.run(["sh", "-c", f"{forget} && {keyscan}"], capture_output=True).returncode == 0
    with open_transport(host=sshd_server.alias, ssh_config=config) as t:
        assert t.run(["echo", "trusted again"]).stdout == "trusted again\n"
