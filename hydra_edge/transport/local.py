"""This machine as the device: commands run under ``sh`` in a working directory.

Going through ``sh -c`` with the same quoted line the remote transports send keeps the
semantics identical (builtins, ``command not found`` exit 127), so calibrating locally
rehearses exactly what a board will run.
"""

from __future__ import annotations

import platform
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Mapping

from .base import Launch, Transport, remote_command, sha256_file
from .errors import RemoteFileNotFoundError, TransportError


class LocalTransport(Transport):
    """Runs device commands on this machine; relative device paths resolve in ``workdir``."""

    def __init__(self, workdir: str | Path | None = None) -> None:
        super().__init__()
        self._owns_workdir = workdir is None  # a temp dir we made is ours to remove
        self.workdir = Path(workdir if workdir is not None else tempfile.mkdtemp(prefix="hydra-edge-local-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.base_dir = str(self.workdir.resolve())
        self.device_id = f"local:{platform.node() or 'localhost'}"

    def _launch(self, argv: list[str], cwd: str | None, env: Mapping[str, str] | None) -> Launch:
        return Launch(["sh", "-c", remote_command(argv, cwd, env)], cwd=str(self.workdir),
                      install_hint="a POSIX sh is required")

    def _resolve(self, remote: str) -> Path:
        return self.workdir / remote  # an absolute remote path replaces workdir

    def connect(self) -> None:
        """Nothing to reach; the working directory was made in ``__init__``."""

    def _upload(self, local: Path, remote: str) -> None:
        try:
            shutil.copyfile(local, self._resolve(remote))
        except OSError as e:
            raise self._transfer_error(f"{e.strerror}", remote, f"copying {local} to") from None

    def _download(self, remote: str, local: Path) -> None:
        try:
            shutil.copyfile(self._resolve(remote), local)
        except OSError as e:
            raise self._transfer_error(f"{e.strerror}", remote, "copying from") from None

    def sha256(self, remote: str) -> str:
        try:
            return sha256_file(self._resolve(remote))
        except FileNotFoundError:
            raise RemoteFileNotFoundError(f"{remote} does not exist on {self.device_id}") from None
        except OSError as e:
            raise TransportError(f"cannot hash {remote} on {self.device_id}: {e.strerror}") from None

    def free_bytes(self, remote_dir: str) -> int:
        return shutil.disk_usage(self._resolve(remote_dir)).free

    @contextmanager
    def _forwarding(self, remote_port: int, local_port: int) -> Iterator[None]:
        """Nothing to forward: the device's loopback is this machine's, so its port is opened as it is."""
        if local_port != remote_port:
            raise TransportError(f"this machine is the device: its port {remote_port} is opened as it is; "
                                 f"give no other local port than {remote_port}")
        yield

    def close(self) -> None:
        super().close()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
