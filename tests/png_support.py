"""Just enough PNG decoding (8-bit RGB/RGBA, non-interlaced: what Chromium writes) to tell
a rendered page from a blank one, without an imaging library."""

from __future__ import annotations

import struct
import zlib

import numpy as np


def decode(data: bytes) -> np.ndarray:
    """The image as an (height, width, channels) uint8 array."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, [], 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and not interlace, (depth, color, interlace)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8)
    stride = width * channels
    rows = raw.reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        f, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 0xFF
        elif f == 1:
            cur = _sub(line, channels)
        else:
            cur = _slow(int(f), line, prev, channels)
        out[y] = cur
        prev = cur
    return out.reshape(height, width, channels)


def _sub(line: np.ndarray, bpp: int) -> np.ndarray:
    return (line.reshape(-1, bpp).cumsum(axis=0).reshape(-1)) & 0xFF


def _slow(f: int, line: np.ndarray, prev: np.ndarray, bpp: int) -> np.ndarray:
    cur = [0] * len(line)
    up = prev.tolist()
    src = line.tolist()
    for i, x in enumerate(src):
        a = cur[i - bpp] if i >= bpp else 0
        b = up[i]
        if f == 3:
            cur[i] = (x + ((a + b) >> 1)) & 0xFF
        else:
            c = up[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[i] = (x + pred) & 0xFF
    return np.array(cur, dtype=np.int32)


def colors(image: np.ndarray) -> int:
    """Distinct colours (RGB) in the image."""
    rgb = image[..., :3].reshape(-1, 3).astype(np.uint32)
    return len(np.unique((rgb[:, 0] << 16) | (rgb[:, 1] << 8) | rgb[:, 2]))
