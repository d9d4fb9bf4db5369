"""Calibration: measure each artefact of a bundle on a device (over ssh, adb or locally)."""
