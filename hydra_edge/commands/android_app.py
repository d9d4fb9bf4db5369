"""``hydra-edge android-app``: an installable demo APK carrying a bundle and its lookup table."""

from __future__ import annotations

from pathlib import Path

import click

from .base import command

PASSWORD_FORMS = "env:NAME (a variable), file:PATH (its first line) or pass:PASSWORD"


@command("android-app", kept=lambda params: f"nothing: {params['out']} is written only once the APK is whole")
@click.option("--bundle", "-b", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Bundle folder written by hydra-edge convert --target android (.pte artefacts).")
@click.option("--lut", "-l", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="lut.json that hydra-edge lut built for this bundle.")
@click.option("--out", "-o", type=click.Path(dir_okay=False, path_type=Path), default=Path("hydra-edge-demo.apk"),
              show_default=True, help="The signed APK.")
@click.option("--keystore", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Sign with this keystore (JKS or PKCS12; default: a debug key made once under "
                   "~/.config/hydra-edge). Needs --key-alias and --ks-pass.")
@click.option("--key-alias", default=None, help="Alias of the key in --keystore.")
@click.option("--ks-pass", default=None, help=f"Password of --keystore: {PASSWORD_FORMS}.")
@click.option("--key-pass", default=None, help=f"Password of the key, if not the store's: {PASSWORD_FORMS}.")
def android_app(bundle: Path, lut: Path, out: Path, keystore: Path | None, key_alias: str | None,
                ks_pass: str | None, key_pass: str | None) -> None:
    """Build the Android demo app (apps/android-demo/app) with a bundle and its table inside.

    Compiles with javac against Android's framework classes, dexes with dx, packages with aapt,
    aligns and signs (APK Signature Scheme v2 and v3): no Gradle, no Android SDK. The signing key is
    checked before anything is built. Before packaging, every head count runs on its golden inputs in the
    APK's own ExecuTorch runtime (its x86_64 build, on an x86_64 Linux host); one that fails there stops
    the build. The app runs the .pte files in ExecuTorch and picks the head count from the phone's thermal
    status and battery; `--es mode bench` times every artefact.

    \b
    Example:
      hydra-edge android-app --bundle bundles/android --lut lut/lut.json --out demo.apk
      adb install demo.apk
      read -rs RELEASE_PASS && export RELEASE_PASS      # typed unseen, kept out of the history
      hydra-edge android-app --bundle bundles/android --lut lut/lut.json --out demo.apk \\
          --keystore release.p12 --key-alias release --ks-pass env:RELEASE_PASS
    """
    from ..android.apk import SigningKey, build_apk, password

    key = None
    if keystore is not None:
        if key_alias is None or ks_pass is None:
            missing = [name for name, value in (("--key-alias", key_alias), ("--ks-pass", ks_pass)) if value is None]
            raise click.UsageError(f"--keystore needs {' and '.join(missing)} (passwords as {PASSWORD_FORMS})")
        store_pass = password(ks_pass, "--ks-pass")
        key = SigningKey(keystore, key_alias, store_pass,
                         store_pass if key_pass is None else password(key_pass, "--key-pass"))
    elif key_alias is not None or ks_pass is not None or key_pass is not None:
        raise click.UsageError("--key-alias, --ks-pass and --key-pass name the key in --keystore; give --keystore "
                               "too, or drop them to sign with hydra-edge's debug key")
    times = build_apk(bundle, lut, out, key)
    size = out.stat().st_size / 2**20
    click.echo(f"wrote {out} ({size:.1f} MiB) in {times['total_s']:.0f} s; install with: adb install -r {out}")
