"""Fuzz the image reader: byte-mutated PNG, JPEG, TIFF, GIF, WebP, BMP and PPM files, each one warning or an image.

Seed files are written here with Pillow from real pictures that scikit-learn ships (its sample photo
``china.jpg``, scaled down, and its 8x8 digits), nothing downloaded: every format the reader accepts in
the modes it meets (grey, colour, alpha, palette; 16-bit and float TIFF; JPEG baseline and progressive;
WebP lossy and lossless; PPM and PGM). Each trial copies one seed, mutates it (bit flips, bytes set to
edge values, a run inserted, deleted or repeated, the file truncated, a digit of a text header changed;
mostly in the first bytes, where the headers are) and reads it with
``hydra_edge.runtime.preprocess.load_image``. The outcome of a file is one of:

* ``image``: a finite (C, H, W) float32 array;
* ``refused``: a ``HydraEdgeError`` of one line (a warning where the reader's callers skip the file);
* ``failure``: anything else: another exception (what a user sees as a traceback), a message of several
  lines, non-finite pixels, or a read slower than ``--slow-s``.

Prints a table per format and writes ``image_fuzz.json`` under ``--out``. The suite runs a bounded slice
of the same trials (``tests/test_image_input.py::test_byte_mutated_images_are_an_image_or_one_line``).

    .venv/bin/python bench/image_fuzz.py --trials 20000
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
Reader = Callable[[Path], np.ndarray]


def seed_files() -> dict[str, bytes]:
    """``name.suffix`` -> the bytes of a small valid image of each format and mode the reader accepts."""
    from PIL import Image
    from sklearn.datasets import load_digits, load_sample_image

    photo = Image.fromarray(load_sample_image("china.jpg")).resize((48, 32), Image.BICUBIC)  # a real photo
    digit = Image.fromarray((load_digits().images[0] * 15).astype(np.uint8), "L").resize((16, 16))
    grey = photo.convert("L")
    deep = np.asarray(grey, np.uint16) * 257

    def encode(im: Image.Image, fmt: str, **options: Any) -> bytes:
        buf = io.BytesIO()
        im.save(buf, fmt, **options)
        return buf.getvalue()

    return {
        "rgb.png": encode(photo, "PNG"), "grey.png": encode(grey, "PNG"), "digit.png": encode(digit, "PNG"),
        "alpha.png": encode(photo.convert("RGBA"), "PNG"), "palette.png": encode(photo.quantize(16), "PNG"),
        "deep.png": encode(Image.fromarray(deep), "PNG"),
        "baseline.jpg": encode(photo, "JPEG", quality=85), "progressive.jpg": encode(photo, "JPEG", progressive=True),
        "grey.jpg": encode(grey, "JPEG"),
        "rgb.tif": encode(photo, "TIFF"), "lzw.tif": encode(photo, "TIFF", compression="tiff_lzw"),
        "deep.tif": encode(Image.fromarray(deep), "TIFF"),
        "float.tif": encode(Image.fromarray(np.asarray(grey, np.float32) / 255), "TIFF"),
        "photo.gif": encode(photo, "GIF"), "digit.gif": encode(digit, "GIF"),
        "lossy.webp": encode(photo, "WEBP", quality=80), "lossless.webp": encode(photo, "WEBP", lossless=True),
        "rgb.bmp": encode(photo, "BMP"), "grey.bmp": encode(grey, "BMP"),
        "rgb.ppm": encode(photo, "PPM"), "grey.pgm": encode(grey, "PPM"),
    }


EDGE_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """``data`` with one to four mutations, most of them within its first 64 bytes (the headers)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        head = min(len(out), 64) if rng.random() < 0.7 else len(out)
        if not out:
            break
        at = rng.randrange(max(head, 1))
        kind = rng.randrange(7)
        if kind == 0:  # flip a bit
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1:  # an edge value
            out[at] = rng.choice(EDGE_BYTES)
        elif kind == 2:  # a random run
            out[at:at + rng.randint(1, 8)] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == 3:  # delete a run
            del out[at:at + rng.randint(1, 16)]
        elif kind == 4:  # repeat a run
            out[at:at] = out[at:at + rng.randint(1, 16)] * rng.randint(1, 4)
        elif kind == 5:  # truncate
            del out[rng.randrange(len(out)):]
        else:  # a text header's digit made a letter, a sign, a separator or many digits (PPM, PGM)
            digits = [i for i, b in enumerate(out[:64]) if 0x30 <= b <= 0x39]
            if digits:
                i = rng.choice(digits)
                out[i:i + 1] = rng.choice([b"x", b"-", b"_", b" ", b"\xef\xbc\x91", b"9" * rng.randint(2, 12)])
    return bytes(out)


@dataclass
class Outcomes:
    """Counts per outcome for one format, and the first few failures (their exception and where)."""

    files: int = 0
    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    warnings: int = 0
    slowest_s: float = 0.0


def read_one(reader: Reader, path: Path, slow_s: float) -> tuple[str, str, int, float]:
    """(outcome, detail, Python warnings shown, seconds) of reading one file."""
    from hydra_edge.errors import HydraEdgeError

    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        try:
            pixels = reader(path)
        except HydraEdgeError as e:
            outcome, detail = ("refused", "") if "\n" not in str(e) else ("failure", f"several lines: {e!r}")
        except Exception as e:  # noqa: BLE001 -- what the fuzz looks for
            where = traceback.extract_tb(e.__traceback__)[-1]
            outcome, detail = "failure", f"{type(e).__name__}: {e} ({Path(where.filename).name}:{where.lineno})"
        else:
            finite = isinstance(pixels, np.ndarray) and pixels.dtype == np.float32 and bool(np.isfinite(pixels).all())
            outcome, detail = ("image", "") if finite else ("failure", "not a finite float32 image")
    seconds = time.perf_counter() - start
    if outcome != "failure" and seconds > slow_s:
        outcome, detail = "failure", f"took {seconds:.1f} s"
    return outcome, detail, len(shown), seconds


def fuzz(trials: int, seed: int = 0, reader: Reader | None = None, work: Path | None = None,
         slow_s: float = 5.0) -> dict[str, Outcomes]:
    """``trials`` mutated files, spread evenly over the seed files in a fixed order: format -> outcomes."""
    if reader is None:
        from hydra_edge.runtime.preprocess import load_image

        def reader(path: Path) -> np.ndarray:
            return load_image(path, 16, 3)

    seeds = seed_files()
    rng = random.Random(seed)
    results: dict[str, Outcomes] = {}
    with tempfile.TemporaryDirectory(prefix="hydra-edge-image-fuzz-", dir=work) as tmp:
        for trial in range(trials):
            name = list(seeds)[trial % len(seeds)]
            path = Path(tmp) / f"{trial}{Path(name).suffix}"
            path.write_bytes(mutate(seeds[name], rng))
            outcome, detail, shown, seconds = read_one(reader, path, slow_s)
            path.unlink()
            result = results.setdefault(name, Outcomes())
            result.files += 1
            result.counts[outcome] += 1
            result.warnings += shown
            result.slowest_s = max(result.slowest_s, seconds)
            if detail and len(result.failures) < 5:
                result.failures.append(f"trial {trial}: {detail}")
    return results


def table(results: dict[str, Outcomes]) -> str:
    rows = ["| seed file | files | image | refused (one line) | failure | Python warnings | slowest (s) |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        rows.append(f"| {name} | {r.files} | {r.counts['image']} | {r.counts['refused']} | {r.counts['failure']} "
                    f"| {r.warnings} | {r.slowest_s:.3f} |")
    total = Outcomes()
    for r in results.values():
        total.files += r.files
        total.counts.update(r.counts)
        total.warnings += r.warnings
        total.slowest_s = max(total.slowest_s, r.slowest_s)
    rows.append(f"| all | {total.files} | {total.counts['image']} | {total.counts['refused']} | "
                f"{total.counts['failure']} | {total.warnings} | {total.slowest_s:.3f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20_000, help="mutated files to read")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slow-s", type=float, default=5.0, help="a read slower than this is a failure")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ns = ap.parse_args()
    from PIL import __version__ as pillow

    from hydra_edge.atomic import write_json
    from hydra_edge.profiling.timing import host_cpu

    start = time.perf_counter()
    results = fuzz(ns.trials, ns.seed, slow_s=ns.slow_s)
    seconds = time.perf_counter() - start
    print(table(results))
    failures = sum(r.counts["failure"] for r in results.values())
    print(f"{ns.trials} files in {seconds:.0f} s; {failures} failures")
    for name, r in results.items():
        for line in r.failures:
            print(f"  {name} {line}")
    ns.out.mkdir(parents=True, exist_ok=True)
    write_json(ns.out / "image_fuzz.json", {
        "host": host_cpu(), "python": sys.version.split()[0], "pillow": pillow,
        "settings": {"trials": ns.trials, "seed": ns.seed, "slow_s": ns.slow_s}, "seconds": round(seconds, 1),
        "failures": failures,
        "formats": {name: {"files": r.files, **{k: r.counts[k] for k in ("image", "refused", "failure")},
                           "python_warnings": r.warnings, "slowest_s": round(r.slowest_s, 4),
                           "first_failures": r.failures} for name, r in results.items()},
    })
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
