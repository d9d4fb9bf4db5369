"""Image preprocessing, numpy and Pillow only: the same pixels on the host (training, checks) and the device.

Images go through the evaluation transform of DeiT and the official HydraViT release (timm's
``transforms_imagenet_eval`` with the models' crop_pct 0.9 and bicubic interpolation): the
shorter side is resized to ``floor(img_size / 0.9)`` (248 for 224) keeping the aspect ratio,
the centre ``img_size`` square is cropped, and the pixels are normalised. Grayscale models are
normalised with mean = std = 0.5, colour models with ImageNet's statistics, as both were trained.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import math
import os
import stat
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..atomic import NotARegularFile
from ..errors import HydraEdgeError

if TYPE_CHECKING:
    from PIL import Image

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".ppm", ".gif", ".tif", ".tiff"}
CROP_PCT = 0.9  # the crop is this fraction of the resized image's shorter side
# What a file with one of those suffixes may hold, by its content (JPEG includes a phone's MPO).
FORMATS = ("PNG", "JPEG", "BMP", "WEBP", "PPM", "GIF", "TIFF")
# Pillow's own warning threshold (a quarter of a gigabyte of 24-bit pixels): an 89-megapixel photo reads, a
# 30000 x 30000 PNG of under 1 MB (900 megapixels, gigabytes once decoded) is refused from its header.
MAX_PIXELS = 89_478_485
# The 8-bit modes Pillow converts to both L and RGB (alpha dropped); ``eight_bit`` maps the others onto L.
_CONVERTIBLE = frozenset({"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "HSV"})


def normalisation(in_chans: int) -> Tuple[Sequence[float], Sequence[float]]:
    return ((0.5,), (0.5,)) if in_chans == 1 else (IMAGENET_MEAN, IMAGENET_STD)


def normalise(pixels: np.ndarray, in_chans: int) -> np.ndarray:
    """(H, W[, C]) uint8 pixels -> (C, H, W) float32, normalised for the model."""
    a = pixels.astype(np.float32).reshape(pixels.shape[0], pixels.shape[1], -1) / 255.0
    mean, std = normalisation(in_chans)
    a = (a - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def resize_size(img_size: int) -> int:
    """The shorter side before the centre crop: ``floor(224 / 0.9) = 248``, as timm computes it."""
    return math.floor(img_size / CROP_PCT)


def transform(im: "Image.Image", img_size: int, in_chans: int) -> np.ndarray:
    """The evaluation transform on a decoded image: (C, H, W) float32, ready for the model.

    Colour modes become RGB (alpha dropped, as PIL's ``convert`` does for timm's loader) or L; 16-bit,
    32-bit and float pixels are first made 8-bit by their range (``eight_bit``), never clipped.
    Sizes and the crop's corner are computed as torchvision's ``Resize(int)`` and ``CenterCrop``
    do, so the pixels are those of the official evaluation.
    """
    from PIL import Image

    im = eight_bit(im).convert("L" if in_chans == 1 else "RGB")
    size, (w, h) = resize_size(img_size), im.size
    if min(w, h) != size:  # the longer side scaled by the same factor, truncated
        im = im.resize((size, int(size * h / w)) if w <= h else (int(size * w / h), size), Image.BICUBIC)
    w, h = im.size
    left, top = int(round((w - img_size) / 2.0)), int(round((h - img_size) / 2.0))
    return normalise(np.asarray(im.crop((left, top, left + img_size, top + img_size))), in_chans)


def load_image(path: Union[str, Path], img_size: int, in_chans: int) -> np.ndarray:
    """Read an image file (``read_image``) and apply ``transform``: (C, H, W) float32."""
    return transform(read_image(path), img_size, in_chans)


def read_image(path: Union[str, Path]) -> "Image.Image":
    """The decoded pixels of an image file, or a ``HydraEdgeError`` of one line naming it: the one reader of
    image files (training, evaluation, conversion's held-out set, the board app).

    Why so guarded: an image file is data from anywhere (a phone, a scrape, a colleague's disk), and Pillow's
    decoders answer damage with OSError mostly but also ValueError, SyntaxError, EOFError, struct.error,
    IndexError, DecompressionBombError and more (``tests/test_image_input.py``'s fuzz test finds them), so any
    exception while Pillow opens and decodes a file is that file's fault, said in one line. Only the file is
    read: it is opened without blocking and refused unless it is a regular file (a FIFO named ``x.png``
    would block a plain open forever), only ``FORMATS`` are tried (never a PostScript file with a ``.png``
    name, which Pillow hands to Ghostscript), and an image over ``MAX_PIXELS`` is refused from its header,
    before its pixels are decoded.
    """
    from PIL import Image

    # Pillow warns (two lines on stderr each) between MAX_PIXELS and twice that, where the image is refused
    # here in one line anyway, and about every damaged TIFF tag or EXIF field it skips, many a file, where the
    # pixels still read or the file is one line. Added at every read: test runners reset the filters.
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"PIL\.")
    Image.init()  # every plugin: a list of formats stops Image.open from loading TIFF's and WebP's itself
    _silence_libtiff()
    try:
        with _regular_file(path) as f, Image.open(f, formats=FORMATS) as im:
            width, height = im.size
            if width * height > MAX_PIXELS:
                raise _TooManyPixels(f"{width}x{height} pixels is")
            im.load()
    except _TooManyPixels as e:
        raise HydraEdgeError(_too_many_pixels(path, str(e))) from None
    except Image.DecompressionBombError:  # Pillow's own limit (twice ours), checked before ours can be
        raise HydraEdgeError(_too_many_pixels(path, "its size is")) from None
    except Exception as e:  # noqa: BLE001 -- any failure to decode is the file's (see above)
        raise HydraEdgeError(f"cannot read image {path}: {_why(e)}") from None
    try:
        return eight_bit(im)
    except HydraEdgeError as e:
        raise HydraEdgeError(f"cannot read image {path}: {e}") from None


def eight_bit(im: "Image.Image") -> "Image.Image":
    """``im`` with 8-bit pixels that ``transform`` can convert, by the range its values stand for; else a
    ``HydraEdgeError`` saying why and what to do.

    Why: Pillow's ``convert("L")`` clips 16-bit, 32-bit and float pixels to 0..255, so a 16-bit photo
    becomes all white and a float one in 0..1 all black, and training would learn from blank images
    without a word. 16-bit pixels stand for 0..65535, as every viewer shows them; 32-bit integer pixels
    within 0..65535 are 16-bit ones (Pillow gives a signed 16-bit TIFF that mode); float pixels stand for
    0..1, as scikit-image and float TIFF writers mean them. Other 32-bit or float pixels (depth maps, HDR,
    counts) have no agreed white, and a guess would be a different picture: they are refused.
    """
    from PIL import Image

    if im.mode.startswith("I;16"):  # I;16, I;16B, I;16L, I;16N: unsigned 16-bit, either byte order
        scaled = np.asarray(im, np.float64) / 257.0
    elif im.mode in ("I", "F"):
        pixels = np.asarray(im, np.float64)
        hint = "scale it to 8 or 16 bits (0..65535) as it should look, and save it as an 8- or 16-bit image"
        if not np.isfinite(pixels).all():
            raise HydraEdgeError(f"its floating-point pixels include NaN or infinity; {hint}")
        low, high = float(pixels.min()), float(pixels.max())
        if im.mode == "I":
            if low < 0 or high > 65535:
                raise HydraEdgeError(f"its 32-bit integer pixels run from {low:.0f} to {high:.0f}, beyond 16 bits, "
                                     f"with no agreed white; {hint}")
            scaled = pixels / 257.0
        else:
            if low < 0 or high > 1:
                raise HydraEdgeError(f"its floating-point pixels run from {low:g} to {high:g}, outside the 0..1 "
                                     f"float images stand for; {hint}")
            scaled = pixels * 255.0
    elif im.mode in _CONVERTIBLE:
        return im
    else:  # LAB (a CIELab TIFF), La: Pillow cannot make L or RGB of them
        raise HydraEdgeError(f"Pillow cannot turn its {im.mode} pixels into grey or RGB ones; "
                             "save it as an 8- or 16-bit grey or RGB image")
    return Image.fromarray(np.round(scaled).astype(np.uint8), "L")


@functools.lru_cache(maxsize=None)
def _silence_libtiff() -> None:
    """Stop the libtiff that Pillow decodes TIFFs with from printing its errors and warnings on stderr.

    Why: libtiff writes a line from C to file descriptor 2 about many a damaged TIFF (``tempfile.tif: Using
    code not yet in table.``, ``TIFFFetchStripThing: ...``), past Python's warnings filters and logging, on
    top of the one line ``read_image`` gives for the file; Pillow reads only libtiff's return codes, never
    these messages. libtiff's own switch for them (a null handler) is process-wide and costs nothing per
    image, where redirecting descriptor 2 around each decode would also swallow what other threads print
    while training's reader threads decode. The handlers are looked up through Pillow's ``_imaging`` module,
    so it is the libtiff Pillow links (its wheel's own copy or the system's) that goes quiet; a Pillow built
    without libtiff has nothing to silence.
    """
    from PIL import _imaging

    try:
        pillow = ctypes.CDLL(_imaging.__file__)  # already loaded: the same library, its dependencies in scope
        for name in ("TIFFSetErrorHandler", "TIFFSetErrorHandlerExt",
                     "TIFFSetWarningHandler", "TIFFSetWarningHandlerExt"):
            setter = getattr(pillow, name)
            setter.argtypes, setter.restype = [ctypes.c_void_p], ctypes.c_void_p
            setter(None)
    except (OSError, AttributeError):  # no libtiff behind this Pillow, or a platform that hides its symbols
        pass


class _TooManyPixels(Exception):
    """Raised inside ``read_image`` to leave Pillow's context managers before the message is written."""


def _too_many_pixels(path: Union[str, Path], size: str) -> str:
    return (f"cannot read image {path}: {size} more than {MAX_PIXELS:,} pixels (decoding it would take "
            "gigabytes: a decompression bomb looks like this); scale it down or remove it")


def _why(e: Exception) -> str:
    """Why Pillow could not read a file, and the fix, on one line of at most a few hundred characters."""
    from PIL import UnidentifiedImageError

    if isinstance(e, UnidentifiedImageError):
        return f"not a {', '.join(FORMATS[:-1])} or {FORMATS[-1]} image; remove it or convert it to one"
    if isinstance(e, ValueError) and "decompressed data too large" in str(e).lower():
        why = "its metadata (a compressed PNG text chunk) inflates past the 1 MB Pillow allows"
        fix = "save it again without metadata, or remove it"
    elif isinstance(e, OSError):  # missing, unreadable, a FIFO, truncated
        why, fix = str(e) or type(e).__name__, "replace it with a good copy or remove it"
    else:
        why, fix = f"damaged ({type(e).__name__}: {e})", "replace it with a good copy or remove it"
    why = " ".join(why.split())
    return f"{why[:300]}{'...' if len(why) > 300 else ''}; {fix}"


def _regular_file(path: Union[str, Path]) -> BinaryIO:
    """``path`` opened for reading if it is a regular file; ``NotARegularFile`` (an OSError) if not.

    The open never blocks (``O_NONBLOCK``): a FIFO where an image belongs would block a plain open until
    something wrote to it, and a board app or a training scan would hang on it.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
                 | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise NotARegularFile(f"{path} is {kind}")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# What ``image_files`` skips, each kind as (one, several), in the order the summary names them.
_SKIPPED = {
    "out": ("link leading outside it", "links leading outside it"),
    "loop": ("link back into a folder being read (a loop)", "links back into a folder being read (a loop)"),
    "dangling": ("dangling link", "dangling links"),
    "special": ("FIFO, socket or device", "FIFOs, sockets or devices"),
    "unlisted": ("folder that cannot be listed", "folders that cannot be listed"),
    "unreadable": ("entry that cannot be read", "entries that cannot be read"),
    "suffix": ("file without an image suffix", "files without an image suffix"),
}


def image_files(folder: Path, inside: Optional[Path] = None) -> Tuple[List[Path], "Counter[str]"]:
    """The files with an image suffix below ``folder``, sorted, as paths under ``folder``, and what was
    skipped, by kind (``skipped_line`` says it in one line). Hidden names (.ipynb_checkpoints, macOS's
    ._photo.jpg companions) are left out without a word.

    Only what lies inside ``inside`` (default ``folder``) once links are followed is read: a class
    folder or image linked from elsewhere (a system icon folder) is not the user's training data, and a
    link back up (``cat/again -> ..``) would read every class again under this one. FIFOs, sockets and
    devices are never opened (a FIFO blocks a reader), and a dangling link or a link loop is no file.
    Links inside the folder are followed: a data set may link its own images.
    """
    bound = (inside or folder).resolve()
    files: List[Path] = []
    skipped: "Counter[str]" = Counter()
    reading: List[Path] = []  # the resolved folders on the way down: a link to one of them is a loop

    def walk(directory: Path) -> None:
        reading.append(directory.resolve())
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            skipped["unlisted"] += 1
            entries = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = Path(entry.path)
            kind = _entry_kind(path, bound, reading)
            if kind == "folder":
                walk(path)
            elif kind == "file" and path.suffix.lower() in IMAGE_SUFFIXES:
                files.append(path)
            else:
                skipped["suffix" if kind == "file" else kind] += 1
        reading.pop()

    walk(folder)
    return files, skipped


def _entry_kind(path: Path, bound: Path, reading: Sequence[Path]) -> str:
    """``folder``, ``file`` or a key of ``_SKIPPED`` for one entry of a folder, following links."""
    try:
        if path.is_symlink():
            target = path.resolve(strict=True)  # a loop: RuntimeError before Python 3.13, ELOOP after
            if not target.is_relative_to(bound):
                return "out"
            if any(folder.is_relative_to(target) for folder in reading):  # itself or a folder above it
                return "loop"
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "dangling"
    except RuntimeError:
        return "loop"
    except OSError as e:
        return "loop" if e.errno == errno.ELOOP else "unreadable"
    return "folder" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "special"


def skipped_line(folder: Path, skipped: "Counter[str]") -> Optional[str]:
    """One warning for everything ``image_files`` skipped under ``folder``, or None when it skipped nothing."""
    if not skipped:
        return None
    parts = [f"{n} {_SKIPPED[kind][n != 1]}" for kind in _SKIPPED for n in [skipped[kind]] if n]
    total = sum(skipped.values())
    return (f"warning: skipped {total} {'entry' if total == 1 else 'entries'} under {folder}: {', '.join(parts)} "
            "(only regular image files inside the folder are read; copy images in rather than linking them)")
