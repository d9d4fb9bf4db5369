"""Shared fixtures: small models and checkpoints with the exact key layouts of timm/DeiT and the release."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import torch

from hydra_edge import HydraViT
from hydra_edge.model.config import HydraConfig
from hydra_edge.runtime.chatter import VERBOSE

# The helpers every test module shares live in the ``support`` package (tests/support): their asserts are
# rewritten as a test module's are, and the modules that offer fixtures are plugins, so a test names the
# fixture and imports nothing for it.
pytest.register_assert_rewrite("support")
pytest_plugins = [
    "support.adbd",  # adb_server, adb_device: the stand-in phone
    "support.compact",  # model_file, converted, root: bundles in every format, full and compact
    "support.demo_board",  # board: the board demo app's bundle, table and images
    "support.kotlin",  # classpath: the Android library, built and tested with Maven
    "support.pythons",  # device_python: the device's Python, without torch
    "support.runner",  # pushed: the device runner as it lies on a board
    "support.sshd",  # sshd_server: the stand-in board
    "support.targets",  # host: a second target profile for convert, as a .toml file
]

torch.set_num_threads(1)  # tiny models: one thread is fastest and keeps the shared machine usable
# Tests send Ctrl-C (SIGINT) to the commands they start. A shell without job control starts a
# background job with SIGINT ignored, and an ignored signal stays ignored in every child: restore it,
# so the suite means the same however it is launched (a handler, unlike SIG_IGN, is reset at exec).
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _verbose_stays_in_its_test() -> Iterator[None]:
    """``-v`` sets HYDRA_EDGE_VERBOSE for the rest of the process (worker processes and device
    runners inherit it): a test that passes -v through ``CliRunner`` must not make the next one loud."""
    before = os.environ.get(VERBOSE)
    yield
    if before is None:
        os.environ.pop(VERBOSE, None)
    else:
        os.environ[VERBOSE] = before


@pytest.fixture
def digits_model() -> HydraViT:
    torch.manual_seed(0)
    return HydraViT.from_preset("digits")


@pytest.fixture
def b16_like() -> HydraConfig:
    """ViT-B/16 widths (12 heads of 64) on a 32 px image with one block: real key shapes, quick to build."""
    return HydraConfig(img_size=32, depth=1, num_classes=10)
