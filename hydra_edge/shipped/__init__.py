"""Files hydra-edge ships beside its code: target profiles, the device runner and the board app.

They live at the top of the source tree (``targets/``, ``calibration/runner.py``,
``apps/board-demo/app.py``). The links in this folder point there, so a checkout and an editable
install read them in place, and a wheel carries copies of them as package data (pyproject.toml).
Reading them through ``importlib.resources`` makes one call work in every case.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from ..errors import HydraEdgeError


def package_path(package: str, *parts: str) -> Path:
    """A file or folder of an installed package as a local path.

    A path, not a ``Traversable``: these files are hashed, pushed to devices and run there, which
    needs them on disk. Every pip install (checkout, editable, wheel) keeps them there.
    """
    found = files(package).joinpath(*parts)
    if not isinstance(found, Path):
        raise HydraEdgeError(f"{package} is installed zipped ({found}); install hydra-edge with pip, unpacked")
    return found


def shipped(*parts: str) -> Path:
    """A shipped file or folder, e.g. ``shipped("targets")`` or ``shipped("board-demo", "app.py")``."""
    return package_path(__name__, *parts)
