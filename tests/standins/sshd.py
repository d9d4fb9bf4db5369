"""Old home of the sshd stand-in, kept for modules not yet moved to ``support``; delete when none imports it."""

from support.sshd import SshServer, sshd_server

__all__ = ["SshServer", "sshd_server"]
