"""The Android demo app's host-side build: ``hydra-edge android-app`` (see ``apk``)."""
