"""Controller RPC frames: ``u32 big-endian length | msgpack map`` (sans-I/O, pure).

``encode_frame`` builds one frame (``encode_answer`` a successful response's, whose body may be
:class:`Packed` already); :class:`FrameDecoder` is fed arbitrary chunks of a byte
stream and returns every complete map. Anything that is not a well-formed frame holding a map
— an oversized or zero length, undecodable msgpack, a top-level value that is not a map —
raises :class:`FrameError`; the caller then closes the connection (the stream position is
lost, so there is no way to resynchronise).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "HEADER",
    "FrameDecoder",
    "FrameError",
    "Packed",
    "encode_answer",
    "encode_frame",
]

DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024
HEADER = struct.Struct(">I")


class FrameError(Exception):
    """The byte stream does not hold a valid frame; close the connection."""


def encode_frame(obj: dict[str, Any], max_frame_bytes: int | None = None) -> bytes:
    """Encode ``obj`` (a map) as one frame; ``FrameError`` if it is not a map or too large."""
    if not isinstance(obj, dict):
        raise FrameError(f"a frame holds a map, not {type(obj).__name__}")
    try:
        payload: bytes = msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameError(f"cannot encode frame: {exc}") from exc
    if max_frame_bytes is not None and len(payload) > max_frame_bytes:
        raise FrameError(f"frame of {len(payload)} bytes exceeds the limit of {max_frame_bytes}")
    return HEADER.pack(len(payload)) + payload


@dataclass(frozen=True, slots=True)
class Packed:
    """A response body already encoded as a msgpack map: one encoding shared by many answers
    (the same metadata batches to every broker that fetches them), sent as it is."""

    payload: bytes


_BODY_KEY: bytes = msgpack.packb("body")


def encode_answer(correlation_id: int, body: dict[str, Any] | Packed) -> bytes:
    """The frame of a successful response; byte for byte what :func:`encode_frame` makes of
    ``{correlation_id, error_code: 0, error_message: "", body}``, without packing a
    :class:`Packed` body again."""
    head = {"correlation_id": correlation_id, "error_code": 0, "error_message": ""}
    if not isinstance(body, Packed):
        return encode_frame({**head, "body": body})
    packed_head: bytes = msgpack.packb(head, use_bin_type=True)
    assert packed_head[0] == 0x83  # a fixmap of three entries: one more follows, the body
    payload = b"".join((b"\x84", packed_head[1:], _BODY_KEY, body.payload))
    return HEADER.pack(len(payload)) + payload


def decode_payload(payload: bytes | memoryview) -> dict[str, Any]:
    """Decode one frame payload into a map, or raise ``FrameError``."""
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise FrameError(f"undecodable frame payload: {exc.__class__.__name__}: {exc}") from exc
    if not isinstance(obj, dict):
        raise FrameError(f"a frame must hold a map, got {type(obj).__name__}")
    return obj


class FrameDecoder:
    """Incremental decoder: ``feed(chunk)`` returns the maps completed by that chunk."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._failed = False

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held back (0 = at a frame boundary)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add ``data``; return the complete frames' maps in order. Raises ``FrameError``.

        Frames are decoded in place (a view of the chunk, or of the buffer when a frame spans
        chunks) and only an incomplete tail is kept: no copy of each payload and no move of the
        buffer after every frame (a 4 MiB FetchMetadata answer holds thousands)."""
        if self._failed:
            raise FrameError("decoder already failed; the connection must be closed")
        buf = self._buf
        if buf:
            buf += data
            src: bytes | bytearray = buf
        else:
            src = data
        out: list[dict[str, Any]] = []
        pos = 0
        size = len(src)
        max_bytes = self.max_frame_bytes
        try:
            with memoryview(src) as view:
                while size - pos >= HEADER.size:
                    (length,) = HEADER.unpack_from(src, pos)
                    if length == 0:
                        raise FrameError("empty frame")
                    if length > max_bytes:
                        raise FrameError(
                            f"frame length {length} exceeds the limit of {max_bytes} bytes"
                        )
                    end = pos + HEADER.size + length
                    if end > size:
                        break
                    with view[pos + HEADER.size : end] as payload:
                        out.append(decode_payload(payload))
                    pos = end
        except FrameError:
            self._failed = True
            self._buf = bytearray()
            raise
        if src is buf:
            del buf[:pos]
        elif pos < size:
            buf += data[pos:]
        return out


def write_now(fd: int, data: bytes) -> int:
    """Write what a non-blocking socket takes at once, without trio's wait machinery; returns
    the bytes written (0 when its buffer is full)."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
