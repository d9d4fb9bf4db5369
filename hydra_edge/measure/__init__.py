"""The host side of ``hydra-edge calibrate``: measure each artefact of a bundle on a device (over ssh,
adb or locally) and record it. What runs on the device is ``calibration/runner.py`` (top level),
beside the recorded tables; this package pushes it, drives it and keeps what it reports."""
