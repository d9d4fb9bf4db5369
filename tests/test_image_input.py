"""Bad image files are one line each, wherever images are read, and never a traceback or a blank image.

Training (``train.data``), evaluation and conversion's held-out set (the same ``ImageFolder``) and the board
app (``apps/board-demo/app.py``) all read through ``runtime.preprocess.read_image``. Every file here is made
by the test with Pillow or by hand (PNG chunks), or is one of scikit-image's bundled images; nothing is
downloaded.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import struct
import sys
import warnings
import zlib
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from hydra_edge.cli import main
from hydra_edge.errors import HydraEdgeError
from hydra_edge.model.config import preset
from hydra_edge.runtime.preprocess import MAX_PIXELS, load_image
from hydra_edge.train.data import data_classes, load_data

ROOT = Path(__file__).resolve().parents[1]


def script(path: Path, name: str) -> ModuleType:
    """A script of the repository (the board app) imported as a module."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def board_app() -> ModuleType:
    """The board app as a module: its folder reader is what a board runs on ``--images``."""
    return script(ROOT / "apps" / "board-demo" / "app.py", "board_demo_app")


def classes(root: Path, counts: dict[str, int] | None = None) -> Path:
    """Class folders of small 8-bit images, each class its own shade."""
    rng = np.random.default_rng(0)
    for c, (name, n) in enumerate((counts or {"cat": 6, "dog": 6}).items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            pixels = np.full((12, 10), 60 * c, np.uint8) + rng.integers(0, 30, (12, 10), dtype=np.uint8)
            Image.fromarray(pixels, "L").save(root / name / f"{i}.png")
    return root


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bilevel_png(width: int, height: int, before_pixels: bytes = b"") -> bytes:
    """A complete, valid 1-bit PNG of ``width`` x ``height`` white pixels, written row by row (a 30000 x 30000
    one is 110 KB: what makes a decompression bomb); ``before_pixels``: chunks placed before its IDAT."""
    row = b"\x00" + b"\xff" * ((width + 7) // 8)
    z = zlib.compressobj(9)
    pixels = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + before_pixels + png_chunk(b"IDAT", pixels)
            + png_chunk(b"IEND", b""))


def text_bomb_png(inflated: int = 50_000_000) -> bytes:
    """An 8 x 8 PNG whose zTXt chunk (compressed text, before the pixels) inflates to ``inflated`` bytes:
    about 50 KB on disk for 50 MB of text."""
    text = b"Comment\x00\x00" + zlib.compress(b"a" * inflated, 9)
    return bilevel_png(8, 8, before_pixels=png_chunk(b"zTXt", text))


def skipped(records: list[logging.LogRecord], name: str) -> list[str]:
    return [r.getMessage() for r in records if name in r.getMessage()]


def train_cli(data: Path, out: Path) -> tuple[int, str]:
    """``hydra-edge train`` for one epoch of the digits preset: (exit code, output)."""
    result = CliRunner().invoke(main, ["train", "--data", str(data), "--preset", "digits", "--epochs", "1",
                                       "--out", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output


# --- 1. decompression bombs: too many pixels ----------------------------------------------------------------


def test_an_image_of_too_many_pixels_is_one_line_in_training_and_on_the_board(tmp_path, caplog):
    data = classes(tmp_path / "data")
    (data / "cat" / "bomb.png").write_bytes(bilevel_png(30_000, 30_000))  # 900 Mpx: past Pillow's own error
    (data / "dog" / "big.png").write_bytes(bilevel_png(10_000, 10_000))  # 100 Mpx: Pillow only warns
    assert (data / "cat" / "bomb.png").stat().st_size < 200_000
    with warnings.catch_warnings(record=True) as shown, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        split = load_data(str(data), preset("digits", num_classes=2))
        samples = board_app().folder_images(data, 8, 1, ["cat", "dog"])
        code, output = train_cli(data, tmp_path / "run")
    assert len(split.train) + len(split.val) == 12 and len(samples) == 12
    assert code == 0 and "Traceback" not in output, output
    for name, size in (("bomb.png", "its size is"), ("big.png", "10000x10000 pixels is")):
        lines = skipped(caplog.records, name)
        assert len(lines) == 3, lines  # once by load_data, once by the board app, once by train
        assert all(f"{size} more than {MAX_PIXELS:,} pixels" in line and "\n" not in line for line in lines)
        assert all(line.startswith("warning: skipped cannot read image ") for line in lines)
    # Pillow's own two-line warning is not shown as well (other libraries' warnings, such as JAX's about
    # a fork when a test before this one imported it, are not this test's business)
    pillow = [w for w in shown if issubclass(w.category, Image.DecompressionBombWarning) or "PIL" in w.filename]
    assert not pillow, [str(w.message) for w in pillow]


# --- 2. metadata that inflates past Pillow's limit --------------------------------------------------------


def test_a_png_whose_text_inflates_to_50_mb_is_one_line_in_training_and_on_the_board(tmp_path, caplog):
    data = classes(tmp_path / "data")
    (data / "cat" / "text.png").write_bytes(text_bomb_png())
    assert (data / "cat" / "text.png").stat().st_size < 60_000
    with caplog.at_level(logging.WARNING):
        split = load_data(str(data), preset("digits", num_classes=2))
        samples = board_app().folder_images(data, 8, 1, ["cat", "dog"])
        code, output = train_cli(data, tmp_path / "run")
    assert len(split.train) + len(split.val) == 12 and len(samples) == 12
    assert code == 0 and "Traceback" not in output, output
    lines = skipped(caplog.records, "text.png")
    assert len(lines) == 3 and all("metadata" in line and "\n" not in line for line in lines), lines


# --- 3. byte-mutated files of every format ------------------------------------------------------------------


def test_byte_mutated_images_are_an_image_or_one_line(tmp_path):
    """A bounded slice of bench/image_fuzz.py (fixed seed): 2100 mutated files, 100 of each seed file."""
    from bench import image_fuzz as fuzz
    for name, data in fuzz.seed_files().items():  # each seed, unmutated, is an image: the fuzz reads real files
        (tmp_path / name).write_bytes(data)
        outcome, detail, shown, _ = fuzz.read_one(lambda p: load_image(p, 16, 3), tmp_path / name, 2.0)
        assert (outcome, shown) == ("image", 0), (name, detail)
    results = fuzz.fuzz(2100, seed=0, work=tmp_path, slow_s=2.0)
    failures = {name: r.failures for name, r in results.items() if r.counts["failure"]}
    assert not failures, failures
    assert sum(r.counts["image"] for r in results.values()) > 200  # mutations that still decode are read
    assert all(r.counts["refused"] for r in results.values())  # and every format has its refusals
    assert sum(r.warnings for r in results.values()) == 0  # no Python warning on top of the one line


# --- 4. more than 8 bits a pixel ----------------------------------------------------------------------------


def photo_grey() -> np.ndarray:
    """scikit-learn's sample photo, grey, 8 bits: (64, 96) uint8."""
    from sklearn.datasets import load_sample_image

    return np.asarray(Image.fromarray(load_sample_image("china.jpg")).convert("L").resize((96, 64)))


def deep_files(folder: Path) -> dict[str, Path]:
    """The photo as 16-bit PNG and TIFF, 32-bit integer TIFF and float TIFF (0..1), each by its real range."""
    grey = photo_grey()
    files = {"8-bit.png": Image.fromarray(grey), "16-bit.png": Image.fromarray(grey.astype(np.uint16) * 257),
             "16-bit.tif": Image.fromarray(grey.astype(np.uint16) * 257),
             "32-bit.tif": Image.fromarray(grey.astype(np.int32) * 257),
             "float.tif": Image.fromarray(grey.astype(np.float32) / 255)}
    for name, im in files.items():
        im.save(folder / name)
    return {name: folder / name for name in files}


@pytest.mark.parametrize("in_chans", [1, 3])
def test_16_bit_32_bit_and_float_images_are_read_by_their_range_never_blank(tmp_path, in_chans):
    files = deep_files(tmp_path)
    assert {n: Image.open(p).mode for n, p in files.items()} == {
        "8-bit.png": "L", "16-bit.png": "I;16", "16-bit.tif": "I;16", "32-bit.tif": "I", "float.tif": "F"}
    reference = load_image(files["8-bit.png"], 32, in_chans)
    assert reference.std() > 0.1  # a photo, not a flat image
    for name, path in files.items():
        assert np.array_equal(load_image(path, 32, in_chans), reference), name


BAD_DEPTHS = {
    "32-bit beyond 16 bits": (np.arange(64 * 96, dtype=np.int32).reshape(64, 96) * 1000,
                              "32-bit integer pixels run from 0 to 6143000"),
    "negative 32-bit": (np.arange(64 * 96, dtype=np.int32).reshape(64, 96) - 100,
                        "32-bit integer pixels run from -100 to 6043"),
    "float beyond 0..1": (np.linspace(0, 1000, 64 * 96, dtype=np.float32).reshape(64, 96),
                          "floating-point pixels run from 0 to 1000"),
    "float with NaN": (np.where(np.eye(64, 96) > 0, np.nan, 0.5).astype(np.float32),
                       "floating-point pixels include NaN or infinity"),
    "CIELab": (Image.frombytes("LAB", (96, 64), bytes(range(256)) * 72), "cannot turn its LAB pixels into grey"),
}


@pytest.mark.parametrize("case", list(BAD_DEPTHS))
def test_pixels_without_an_agreed_range_are_one_line_in_training_and_on_the_board(tmp_path, caplog, case):
    pixels, why = BAD_DEPTHS[case]
    data = classes(tmp_path / "data")
    (pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)).save(data / "cat" / "deep.tif")
    with caplog.at_level(logging.WARNING):
        split = load_data(str(data), preset("digits", num_classes=2))
        samples = board_app().folder_images(data, 8, 1, ["cat", "dog"])
    assert len(split.train) + len(split.val) == 12 and len(samples) == 12
    lines = skipped(caplog.records, "deep.tif")
    assert len(lines) == 2 and all(why in line and "save it as an 8- or 16-bit " in line for line in lines), lines


# --- 6. a class folder whose name is not UTF-8 -------------------------------------------------------------


def test_a_class_folder_whose_name_is_not_utf8_is_refused_in_one_line_before_training(tmp_path):
    """Such a name trains, then cannot be written into a bundle's manifest (JSON is UTF-8): refused at once."""
    data = classes(tmp_path / "data")
    os.rename(data / "dog", os.fsencode(data) + b"/caf\xe9")  # Latin-1 bytes, as an old card or zip leaves them
    with pytest.raises(HydraEdgeError, match=r"class folder .*data/caf\\xe9's name is not UTF-8 text"):
        data_classes(str(data))
    result = CliRunner().invoke(main, ["train", "--data", str(data), "--preset", "digits", "--epochs", "1",
                                       "--out", str(tmp_path / "run")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: class folder "), result.output
    assert "caf\\xe9" in lines[0] and "rename it" in lines[0] and not (tmp_path / "run").exists()


# --- 5. links, FIFOs and other entries that are no image file inside the folder -----------------------------


def odd_entries(data: Path, outside: Path) -> None:
    """In ``data/cat``: links out of ``data`` (a folder, an image, a device), a link inside it, a FIFO, a dangling
    link, a link loop, a link back to the data folder, and a text file."""
    classes(outside, {"icons": 3})
    cat = data / "cat"
    (cat / "icons").symlink_to(outside / "icons")
    (cat / "linked.png").symlink_to(outside / "icons" / "0.png")
    (cat / "null.png").symlink_to("/dev/null")
    (cat / "inside.png").symlink_to(data / "dog" / "0.png")  # inside the folder: read
    os.mkfifo(cat / "fifo.png")
    (cat / "dangling.png").symlink_to(cat / "gone.png")
    (cat / "loop.png").symlink_to(cat / "loop.png")
    (cat / "again").symlink_to(data)
    (cat / "notes.txt").write_text("not an image")


SKIPPED = ("warning: skipped 8 entries under {}: 3 links leading outside it, 2 links back into a folder being read "
           "(a loop), 1 dangling link, 1 FIFO, socket or device, 1 file without an image suffix (only regular image "
           "files inside the folder are read")


def test_links_out_of_the_folder_fifos_and_loops_are_skipped_and_counted_in_one_line(tmp_path, caplog):
    data = classes(tmp_path / "data")
    odd_entries(data, tmp_path / "elsewhere")
    with caplog.at_level(logging.WARNING):
        split = load_data(str(data), preset("digits", num_classes=2))
        samples = board_app().folder_images(data, 8, 1, ["cat", "dog"])
    files = sorted(str(path) for path, _ in split.train.files + split.val.files)
    assert len(files) == 13 and str(data / "cat" / "inside.png") in files and not any("icons" in f for f in files)
    assert len(samples) == 13
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("\n" not in m for m in messages), messages  # one for training, one on the board
    for message in messages:
        assert message.startswith(SKIPPED.format(data)), message


def test_a_class_folder_linked_from_outside_the_data_folder_is_refused_in_one_line(tmp_path):
    data = classes(tmp_path / "data")
    classes(tmp_path / "system", {"icons": 3})
    (data / "icons").symlink_to(tmp_path / "system" / "icons")
    with pytest.raises(HydraEdgeError, match=r"class folder .*data/icons links to .*system/icons, outside "
                                             r".*data; copy or move its images into the folder"):
        data_classes(str(data))
    result = CliRunner().invoke(main, ["train", "--data", str(data), "--preset", "digits", "--epochs", "1",
                                       "--out", str(tmp_path / "run")])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and "links to" in lines[0] and not (tmp_path / "run").exists()


# --- 3b. what libtiff itself prints about a damaged TIFF --------------------------------------------------


def damaged_lzw_tiff() -> bytes:
    """A 16 x 16 LZW-compressed TIFF whose one strip is 0xFF bytes: a valid header, pixels libtiff cannot decode
    (libtiff prints ``tempfile.tif: Using code not yet in table.`` on stderr from C, before Pillow's error)."""
    import io

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16), dtype=np.uint8)).save(
        buf, "TIFF", compression="tiff_lzw")
    data = bytearray(buf.getvalue())
    with Image.open(io.BytesIO(bytes(data))) as im:
        offset, size = im.tag_v2[273][0], im.tag_v2[279][0]  # StripOffsets, StripByteCounts
    data[offset:offset + size] = b"\xff" * size
    return bytes(data)


@pytest.mark.slow  # starts a Python that imports torch
def test_a_damaged_tiff_is_the_products_one_line_on_stderr_and_nothing_from_libtiff(tmp_path):
    """libtiff's own error lines were written to file descriptor 2 by C code, past Python's warnings filters and
    logging: the terminal showed them on top of the one line. The reader runs in a process of its own here, so
    the test sees that process's stderr as a terminal would, at the descriptor."""
    import subprocess

    data = classes(tmp_path / "data")
    (data / "cat" / "damaged.tif").write_bytes(damaged_lzw_tiff())
    read = ("import sys; from hydra_edge.model.config import preset; from hydra_edge.train.data import load_data; "
            "split = load_data(sys.argv[1], preset('digits', num_classes=2)); "
            "print(len(split.train) + len(split.val))")
    result = subprocess.run([sys.executable, "-c", read, str(data)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.split() == ["12"], result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"warning: skipped cannot read image {data / 'cat' / 'damaged.tif'}: "), lines
    assert lines[0].endswith("; replace it with a good copy or remove it"), lines
