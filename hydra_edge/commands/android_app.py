"""``hydra-edge android-app``: an installable demo APK carrying a bundle and its lookup table."""

from __future__ import annotations

from pathlib import Path

import click

from .base import command


@command("android-app", kept=lambda params: f"nothing: {params['out']} is written only once the APK is whole")
@click.option("--bundle", "-b", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Bundle folder written by hydra-edge convert --target android (.pte artefacts).")
@click.option("--lut", "-l", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="lut.json that hydra-edge lut built for this bundle.")
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=Path("hydra-edge-demo.apk"),
              show_default=True, help="The signed APK.")
@click.option("--keystore", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Sign with this keystore (default: a key made once under ~/.config/hydra-edge).")
@click.option("--key-alias", default="hydra-edge", show_default=True, help="Key alias in --keystore.")
@click.option("--key-pass", default="hydra-edge", show_default=True, help="Password of --keystore and its key.")
def android_app(bundle: Path, lut: Path, out: Path, keystore: Path | None, key_alias: str, key_pass: str) -> None:
    """Build the Android demo app (apps/android-demo/app) with a bundle and its table inside.

    Compiles with javac against Android's framework classes, dexes with dx, packages with aapt,
    aligns and signs: no Gradle, no Android SDK. Before packaging, every head count runs on its golden
    inputs in the APK's own ExecuTorch runtime (its x86_64 build, on an x86_64 Linux host); one that fails
    there stops the build. The app runs the .pte files in ExecuTorch and picks the head count from the
    phone's thermal status and battery; `--es mode bench` times every artefact.

    \b
    Example:
      hydra-edge android-app --bundle bundles/android --lut lut/lut.json --out demo.apk
      adb install demo.apk
    """
    from ..android.apk import build_apk

    times = build_apk(bundle, lut, out, keystore, key_alias, key_pass)
    size = out.stat().st_size / 2**20
    click.echo(f"wrote {out} ({size:.1f} MiB) in {times['total_s']:.0f} s; install with: adb install -r {out}")
