"""The device's Python: this venv's interpreter with ``import torch`` made to fail.

A board or phone runs the runner and the board app without torch; every test that starts them starts
them with this Python, so a stray torch import on the device side fails the test. Offers the
``device_python`` fixture (one per test module).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def torch_free_python(root: Path) -> Path:
    """This venv's Python with ``import torch`` made to fail: the device side must never need it."""
    block = root / "block-torch"
    block.mkdir(parents=True, exist_ok=True)
    (block / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    wrapper = root / "python-without-torch"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{block}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="module")
def device_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return torch_free_python(tmp_path_factory.mktemp("python"))
