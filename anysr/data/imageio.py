"""Reading and writing image files with errors that name the file and the fix.

Images are numpy arrays as OpenCV gives them (BasicSR convention): HWC in BGR order, or HW for grayscale;
uint8 (or uint16 for 16-bit files) unless a caller converts them.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np

from anysr.errors import DataError, OptionError

__all__ = ["IMAGE_EXTENSIONS", "ImageInfo", "is_image_file", "list_images", "probe_bytes", "probe_image", "read_image",
           "decode_image", "write_image"]

# OpenCV's codecs log what they cannot decode (libtiff's 'TIFFReadDirectory: Failed to read directory ...') on
# stderr as they go; anysr names the file and the fix itself (DataError), so those lines would only follow and
# contradict the one-line message.
cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)

try:  # libspng decodes 8-bit PNGs faster than OpenCV's libpng (benchmarks/data.md); optional: anysr[fastpng]
    import pyspng as _pyspng
except ImportError:
    _pyspng = None

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm")

_FLAGS = {
    "unchanged": cv2.IMREAD_UNCHANGED,
    "color": cv2.IMREAD_COLOR,
    "gray": cv2.IMREAD_GRAYSCALE,
}


def is_image_file(path: str | os.PathLike[str]) -> bool:
    """True when the file name has one of ``IMAGE_EXTENSIONS`` (case-insensitive)."""
    return Path(path).suffix.lower() in IMAGE_EXTENSIONS


def subfolder_hint(folder: str | os.PathLike[str]) -> str:
    """For a folder with no images directly inside: '; sub-folders are not read ...' when some of its sub-folders
    hold images (a user's photos sorted into albums), else ''."""
    try:
        subs = sorted(d for d in Path(folder).iterdir() if d.is_dir() and not d.name.startswith("."))
    except OSError:
        return ""
    full = [d for d in subs if any(is_image_file(f) for f in _some_files(d))]
    if not full:
        return ""
    shown = ", ".join(f"'{d.name}'" for d in full[:3]) + (f" and {len(full) - 3} more" if len(full) > 3 else "")
    return (f"; its images are in sub-folders ({shown}), which are not read: give one of them, or gather the images "
            "in one folder")


def _some_files(folder: Path, limit: int = 200) -> list[str]:
    with os.scandir(folder) as it:
        return [e.name for _, e in zip(range(limit), it)]


def list_images(folder: str | os.PathLike[str]) -> list[Path]:
    """The image files directly inside ``folder``, sorted by name, hidden ones (``.name``: macOS's ``._photo.png``
    resource forks, editors' temporaries) left out; DataError if it is not a folder."""
    root = Path(folder)
    if not root.is_dir():
        hint = "it is a file, not a folder" if root.exists() else "it does not exist"
        raise DataError(f"image folder {root}: {hint}; check the path")
    return sorted(p for p in root.iterdir() if p.is_file() and is_image_file(p) and not p.name.startswith("."))


@dataclass(frozen=True)
class ImageInfo:
    """What an image file's header says: size, channels, bits per channel and the decoded pixel type."""

    width: int
    height: int
    channels: int
    bits: int
    dtype: str = "uint8"  # numpy's name of the decoded pixel type: uint8, uint16, float32, ...


_PNG_CHANNELS = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _png_info(head: bytes) -> ImageInfo | None:
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR" or len(head) < 26:
        return None
    width, height, bits, colour = struct.unpack(">IIBB", head[16:26])
    if colour not in _PNG_CHANNELS:
        return None
    return ImageInfo(width, height, _PNG_CHANNELS[colour], 16 if bits == 16 else 8, "uint16" if bits == 16 else "uint8")


def _exif_orientation(body: bytes) -> int:
    """The orientation tag (1-8) of a JPEG APP1 segment's body, 1 when it is not Exif or has none (a damaged
    Exif block is ignored, as decoders do)."""
    if body[:6] != b"Exif\x00\x00":
        return 1
    tiff = body[6:]
    order = {b"II": "<", b"MM": ">"}.get(tiff[:2])
    if order is None:
        return 1
    try:
        ifd = struct.unpack(order + "I", tiff[4:8])[0]
        count = struct.unpack(order + "H", tiff[ifd:ifd + 2])[0]
        for n in range(count):
            at = ifd + 2 + 12 * n
            tag, kind = struct.unpack(order + "HH", tiff[at:at + 4])
            if tag == 0x0112 and kind == 3:  # Orientation, a SHORT
                value = struct.unpack(order + "H", tiff[at + 8:at + 10])[0]
                return value if 1 <= value <= 8 else 1
    except struct.error:  # cut short: no orientation
        return 1
    return 1


def _jpeg_header(f: BinaryIO) -> tuple[ImageInfo | None, int]:
    """A JPEG's frame header (its stored size) and Exif orientation, read from ``f``'s markers."""
    orientation = 1
    f.seek(2)
    while True:
        byte = f.read(1)
        while byte == b"\xff":  # fill bytes before a marker
            byte = f.read(1)
        if not byte:
            return None, orientation
        marker = byte[0]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            continue  # markers without a length
        size = f.read(2)
        if len(size) < 2:
            return None, orientation
        length = struct.unpack(">H", size)[0]
        if marker in _JPEG_SOF:
            body = f.read(6)
            if len(body) < 6:
                return None, orientation
            bits, height, width, comps = struct.unpack(">BHHB", body)
            return (ImageInfo(width, height, comps, bits) if height and width else None), orientation
        if marker == 0xDA or length < 2:  # image data before any frame header: not a usable JPEG
            return None, orientation
        if marker == 0xE1 and orientation == 1:
            orientation = _exif_orientation(f.read(length - 2))
            continue
        f.seek(length - 2, os.SEEK_CUR)


def _jpeg_info(f: BinaryIO) -> ImageInfo | None:
    """A JPEG's size as it is shown: width and height swapped when its Exif orientation turns it (5-8), as
    ``decode_image`` turns the pixels."""
    info, orientation = _jpeg_header(f)
    if info is not None and orientation >= 5:
        return ImageInfo(info.height, info.width, info.channels, info.bits, info.dtype)
    return info


def _orient(img: np.ndarray, orientation: int) -> np.ndarray:
    """``img`` as stored turned upright by its Exif orientation (2-8: mirrored and/or rotated, as viewers and
    OpenCV's ``IMREAD_COLOR`` show it)."""
    if orientation in (5, 6, 7, 8):  # the stored rows are the shown columns
        img = img.swapaxes(0, 1)
        orientation = {5: 1, 6: 2, 7: 3, 8: 4}[orientation]
    if orientation in (2, 3):
        img = img[:, ::-1]
    if orientation in (3, 4):
        img = img[::-1]
    return np.ascontiguousarray(img)


_EXIF_REACH = 1 << 17  # a JPEG's Exif block (APP1, at most 64 KiB) comes before its frame header
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"


def _probe(head: bytes, f: BinaryIO, size: int, source: str) -> ImageInfo:
    """Parse a header (``head`` = the first 32 bytes, ``f`` positioned anywhere, ``size`` the total length)."""
    if not head:
        raise DataError(f"image {source} is empty (0 bytes); re-create or re-download it")
    info = None
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        info = _png_info(head)
        f.seek(max(0, size - len(_PNG_END)))
        if info is not None and f.read(len(_PNG_END)) != _PNG_END:
            raise DataError(f"image {source} is truncated (the PNG has no end marker); re-create or re-download it")
    elif head[:2] == b"\xff\xd8":
        info = _jpeg_info(f)
    else:
        f.seek(0)
        img = decode_image(f.read(), source=source)
        info = ImageInfo(img.shape[1], img.shape[0], 1 if img.ndim == 2 else img.shape[2], img.dtype.itemsize * 8,
                         img.dtype.name)
    if info is None:
        raise DataError(f"image {source} has a damaged header (not a readable PNG/JPEG); re-create or "
                        "re-download it")
    return info


def probe_bytes(data: bytes, source: str = "<bytes>") -> ImageInfo:
    """``probe_image`` of an encoded image held in memory (an LMDB value)."""
    return _probe(bytes(data[:32]), io.BytesIO(data), len(data), source)


def probe_image(path: str | os.PathLike[str]) -> ImageInfo:
    """Size and channels of an image file from its header (PNG, JPEG), or by decoding it (other formats).

    A missing, empty, truncated (PNG) or unrecognisable file raises DataError naming it. Reading a header costs
    two small reads, so whole training sets can be checked at start-up.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            return _probe(f.read(32), f, os.fstat(f.fileno()).st_size, str(p))
    except FileNotFoundError:
        raise DataError(f"image {p} not found; check the path (or the dataroot option that points to it)") from None
    except IsADirectoryError:
        raise DataError(f"image {p} is a folder, not a file; point to an image file") from None
    except OSError as exc:
        raise DataError(f"image {p} cannot be read ({exc.strerror or exc}); check its permissions") from exc


def _flag(flag: str) -> int:
    try:
        return _FLAGS[flag]
    except KeyError:
        raise OptionError(f"flag: unknown image read mode {flag!r}; use one of {', '.join(_FLAGS)}") from None


def _png_damage(buf: np.ndarray) -> str | None:
    """Where a PNG's chunks fail their CRC (``None`` when every chunk checks out, or for another format).

    Checked before decoding, so that bit rot is named here rather than by libpng on stderr (its 'bad adaptive
    filter value' lines cannot be silenced per call); costs one CRC pass, far less than the decode."""
    data = memoryview(buf)
    if bytes(data[:8]) != b"\x89PNG\r\n\x1a\n":
        return None
    pos, end = 8, len(data)
    while pos + 12 <= end:
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        if pos + 12 + length > end:
            return None  # truncated: the decoder says so
        kind = bytes(data[pos + 4:pos + 8])
        crc = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        if zlib.crc32(data[pos + 4:pos + 8 + length]) != crc:
            name = kind.decode("ascii", "replace")
            return f"its {name} chunk at byte {pos} fails its checksum (damaged data)"
        if kind == b"IEND":
            return None
        pos += 12 + length
    return None


# PNG colour types (IHDR byte 25) libspng gives as OpenCV does, at 8 bits: gray, RGB, RGBA (not a palette,
# gray + alpha or any 16-bit image, where pyspng's array differs from OpenCV's)
_SPNG_TYPES = {0: 1, 2: 3, 6: 4}  # colour type -> channels


def _spng_decode(buf: np.ndarray, raw: object) -> np.ndarray | None:
    """An 8-bit gray / RGB / RGBA PNG without transparency chunk, decoded by pyspng into OpenCV's
    ``IMREAD_UNCHANGED`` array (HW, HWC BGR, HWC BGRA); ``None`` for anything else, or when pyspng is missing
    or refuses the file (OpenCV then decodes it and reports what is wrong)."""
    if _pyspng is None or buf.size < 33 or bytes(buf[:8]) != b"\x89PNG\r\n\x1a\n" or bytes(buf[12:16]) != b"IHDR":
        return None
    bits, colour = int(buf[24]), int(buf[25])
    if bits != 8 or colour not in _SPNG_TYPES:
        return None
    data = raw if isinstance(raw, bytes) else buf.tobytes()  # pyspng reads bytes only
    idat = data.find(b"IDAT")
    if idat < 0 or data.find(b"tRNS", 0, idat) >= 0:  # tRNS comes before the pixel data
        return None
    try:
        img = _pyspng.load(data)
    except RuntimeError:
        return None
    channels = _SPNG_TYPES[colour]
    if channels == 1:
        return img[:, :, 0] if img.ndim == 3 else img
    if img.ndim != 3 or img.shape[2] != channels:
        return None
    return cv2.cvtColor(img, cv2.COLOR_RGB2BGR if channels == 3 else cv2.COLOR_RGBA2BGRA)


def decode_image(data: bytes | bytearray | memoryview | np.ndarray, *, flag: str = "unchanged",
                 source: str = "<bytes>") -> np.ndarray:
    """Decode an encoded image (PNG, JPEG, ...) held in memory; ``source`` names it in errors.

    Used for files and for LMDB values alike.
    """
    mode = _flag(flag)
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.reshape(-1)
    if buf.size == 0:
        raise DataError(f"image {source} is empty (0 bytes); re-create or re-download it")
    damage = _png_damage(buf)
    if damage is not None:
        raise DataError(f"image {source} cannot be decoded: {damage}; re-create or re-download it")
    if mode == cv2.IMREAD_UNCHANGED:
        img = _spng_decode(buf, data)
        if img is not None:
            return img
    try:
        img = cv2.imdecode(buf, mode)
    except cv2.error as exc:  # a header OpenCV refuses outright (e.g. a width over CV_IO_MAX_IMAGE_WIDTH)
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else "refused by OpenCV"
        raise DataError(f"image {source} cannot be decoded: {reason}; re-create or re-download it") from None
    if img is None or img.size == 0:
        raise DataError(f"image {source} cannot be decoded: the file is truncated, corrupt or not an image "
                        f"({buf.size} bytes); re-create or re-download it")
    if mode == cv2.IMREAD_UNCHANGED and bytes(buf[:2]) == b"\xff\xd8":  # OpenCV turns the other modes itself
        orientation = _jpeg_header(io.BytesIO(bytes(buf[:_EXIF_REACH])))[1]
        if orientation != 1:
            img = _orient(img, orientation)
    return img


def read_image(path: str | os.PathLike[str], *, flag: str = "unchanged") -> np.ndarray:
    """Read an image file as OpenCV does: ``'unchanged'`` (as stored; gray stays HW), ``'color'`` (HWC BGR)
    or ``'gray'`` (HW). Missing, empty, unreadable or corrupt files raise DataError naming the path."""
    p = Path(path)
    _flag(flag)
    if not p.exists():
        raise DataError(f"image {p} not found; check the path (or the dataroot option that points to it)")
    if not p.is_file():
        raise DataError(f"image {p} is a folder, not a file; point to an image file")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise DataError(f"image {p} cannot be read ({exc.strerror or exc}); check its permissions") from exc
    return decode_image(data, flag=flag, source=str(p))


def write_image(path: str | os.PathLike[str], img: np.ndarray, *, compress_level: int = 3) -> Path:
    """Write ``img`` (uint8 or uint16, HW / HWC BGR) to ``path``, creating folders; the format follows the
    suffix (PNG when there is none or it is ``.png``). The bytes go to a temporary file in the same folder,
    which is then renamed over ``path``, so readers never see a half-written image. Returns the path."""
    p = Path(path)
    arr = np.asarray(img)
    if arr.dtype not in (np.uint8, np.uint16):
        raise DataError(f"write_image {p}: expected a uint8 or uint16 image, got {arr.dtype}; convert it, "
                        "e.g. np.clip(np.round(img * 255), 0, 255).astype(np.uint8) for [0, 1] floats")
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[2] not in (1, 3, 4)) or arr.size == 0:
        raise DataError(f"write_image {p}: expected an HW or HWC image with 1, 3 or 4 channels, "
                        f"got shape {arr.shape}")
    suffix = p.suffix.lower() or ".png"
    params: list[int] = []
    if suffix == ".png":
        params = [cv2.IMWRITE_PNG_COMPRESSION, int(compress_level)]
    try:
        ok, encoded = cv2.imencode(suffix, arr, params)
    except cv2.error:
        ok = False
    if not ok:
        raise DataError(f"write_image {p}: OpenCV cannot encode a {arr.dtype} {arr.shape} image as "
                        f"'{suffix}'; use a .png path")
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "xb") as fh:  # the umask decides the mode, as for a plain write
            fh.write(encoded.tobytes())
        os.replace(tmp, p)
    except OSError as exc:
        with contextlib.suppress(OSError):  # the folder may be read-only or not a folder at all
            tmp.unlink(missing_ok=True)
        raise DataError(f"write_image {p}: cannot write ({exc.strerror or exc}); "
                        "check the folder and the free disk space") from exc
    return p
