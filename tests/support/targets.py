"""The target profile the tests convert for, kept once in ``profiles/host.toml``, and its variants.

host.toml is a user-added profile: fp32 ONNX (converts in seconds), with the Raspberry Pi's signals.
Each variant a test needs is derived from it here, so a change to the profile reaches every test that
converts for it. Profiles that differ on purpose (a tflite one, the minimal ones a loader test accepts or
refuses) stay in their tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HOST_TARGET = (Path(__file__).parent / "profiles" / "host.toml").read_text()
# The artefact alone, no [signals]: what a conversion needs.
ONNX_FP32 = HOST_TARGET[:HOST_TARGET.index("[signals.")]
ONNX_FP32_TWO_THREADS = ONNX_FP32.replace("threads = 1\n", "threads = 2\n")
# A Jetson-like profile: fp16 engines built by trtexec on the device, ONNX fp32 (converts in seconds) on the host.
TRT_TARGET = HOST_TARGET.replace('runtime_min_version = "1.17"\n', 'runtime_min_version = "1.17"\n'
                                 'device_build = "trtexec --onnx={file} --saveEngine={engine} --fp16"\n')
# sysfs paths only (no commands), a battery among them: signals_from_profile reads thermal and battery from sysfs.
SYSFS_TARGET = HOST_TARGET[:HOST_TARGET.index("[signals.commands]")] + 'battery = "/sys/class/power_supply/BAT0/capacity"\n'
# The Raspberry Pi's signals plus a battery (a UPS HAT), as a user-added profile: the board demo app's.
BOARD_TARGET = HOST_TARGET.replace("[signals.files]\n", "[signals.files]\n"
                                   'battery_capacity = "/sys/class/power_supply/battery/capacity"\n')


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A second target for convert (fp32 ONNX on two threads, named "host"), given as a .toml path."""
    path = tmp_path / "host.toml"
    path.write_text(ONNX_FP32_TWO_THREADS)
    return path
