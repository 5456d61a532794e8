"""Kafka wire framing for the broker listener: request headers in, kio-encoded responses out.

Decoding is hand-written for the request header and the few request bodies the broker reads
(Metadata), because Kafka is lenient where kio is strict: unknown tagged fields are skipped and
trailing bytes after a body are ignored. Responses are encoded with kio's generated classes,
filled from one dict of values whatever the version (:func:`build`).
"""

from __future__ import annotations

import dataclasses
import io
import struct
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import KioIndexError, load_request_schema, load_response_schema
from kio.serial import entity_writer

API_PRODUCE, API_FETCH, API_METADATA, API_API_VERSIONS = 0, 1, 3, 18

# api key -> (min version, max version) the listener answers
SUPPORTED: dict[int, tuple[int, int]] = {
    API_METADATA: (0, 13),
    API_API_VERSIONS: (0, 4),
}
# flexible (compact, tagged) request versions start here
_FLEXIBLE_FROM = {API_METADATA: 9, API_API_VERSIONS: 3}


class DecodeError(ValueError):
    """A request that cannot be read; the connection that sent it is closed."""


class Deferred:
    """A response that is not ready yet (produce purgatory, long-polling fetch): the listener
    awaits ``wait()`` in request order, after the responses to earlier requests."""

    __slots__ = ("wait",)

    def __init__(self, wait: Callable[[], Awaitable[bytes | None]]) -> None:
        self.wait = wait


class Reader:
    """A cursor over a request frame with Kafka's primitive types."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise DecodeError(
                f"truncated request: need {n} bytes at {self.pos}, have {len(self.data) - self.pos}"
            )
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def int8(self) -> int:
        value: int = struct.unpack(">b", self._take(1))[0]
        return value

    def boolean(self) -> bool:
        return self._take(1) != b"\x00"

    def int16(self) -> int:
        value: int = struct.unpack(">h", self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack(">i", self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = struct.unpack(">q", self._take(8))[0]
        return value

    def take(self, n: int) -> bytes:
        """The next ``n`` raw bytes."""
        return self._take(n)

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self._take(16))

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise DecodeError("varint too long")

    def string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self._take(n).decode("utf-8", "replace")

    def compact_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._take(n).decode("utf-8", "replace")

    def array_len(self, flexible: bool) -> int:
        """Element count; -1 for a null array."""
        n = self.uvarint() - 1 if flexible else self.int32()
        if n > len(self.data):
            raise DecodeError(f"array length {n} larger than the frame")
        return n

    def skip_tags(self) -> None:
        """Skip a tagged-field section, whatever tags it holds (Kafka ignores unknown ones)."""
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


@cache
def is_flexible(api_key: int, version: int) -> bool:
    """Whether this request version uses compact types and header v2 (kio's schema decides for
    APIs outside ``_FLEXIBLE_FROM``; unknown API/version pairs count as not flexible)."""
    if api_key in _FLEXIBLE_FROM:
        return version >= _FLEXIBLE_FROM[api_key]
    try:
        return bool(load_request_schema(api_key, version).__flexible__)
    except KioIndexError:
        return False


def read_header(frame: bytes) -> tuple[RequestHeader, Reader]:
    """Read the request header (v1, or v2 for flexible versions). Returns a reader positioned
    at the body."""
    r = Reader(frame)
    api_key, api_version, correlation_id = r.int16(), r.int16(), r.int32()
    client_id = r.string()
    if is_flexible(api_key, api_version):
        r.skip_tags()
    return RequestHeader(api_key, api_version, correlation_id, client_id), r


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    """``topics`` None = all topics; otherwise (name or None, topic id or None) pairs."""

    topics: tuple[tuple[str | None, uuid.UUID | None], ...] | None
    allow_auto_topic_creation: bool


def read_metadata_request(version: int, r: Reader) -> MetadataRequest:
    """Decode a Metadata request body (v0–v13); trailing bytes are left unread."""
    flexible = version >= 9
    n = r.array_len(flexible)
    topics: list[tuple[str | None, uuid.UUID | None]] | None = None
    if n >= 0:
        topics = []
        for _ in range(n):
            topic_id = r.uuid() if version >= 10 else None
            name = r.compact_string() if flexible else r.string()
            if flexible:
                r.skip_tags()
            topic_id = None if topic_id is None or topic_id.int == 0 else topic_id
            if name is None and topic_id is None:  # Kafka refuses such a request too
                raise DecodeError("Metadata request names a topic by neither name nor id")
            topics.append((name, topic_id))
    if version == 0 and not topics:
        topics = None  # v0: empty list = all topics
    auto = r.boolean() if version >= 4 else True
    return MetadataRequest(None if topics is None else tuple(topics), auto)


# ---- responses ---------------------------------------------------------------------------------


@cache
def response_class(api_key: int, version: int) -> type:
    return load_response_schema(api_key, version)


@cache
def request_class(api_key: int, version: int) -> type:
    """kio's request class (cached: kio resolves it by name on every lookup, a few percent of
    a broker's CPU when done per request)."""
    return load_request_schema(api_key, version)


def _nested_classes(cls: type) -> dict[str, type]:
    """Field name -> nested entity class for tuple-of-entity fields of ``cls``."""
    import sys
    import typing

    module = sys.modules[cls.__module__]
    hints = typing.get_type_hints(cls, vars(module))
    out: dict[str, type] = {}
    for f in dataclasses.fields(cls):
        args = typing.get_args(hints[f.name])
        if args and dataclasses.is_dataclass(args[0]):
            out[f.name] = typing.cast(type, args[0])
    return out


_NESTED: dict[type, dict[str, type]] = {}


def build(cls: type, values: dict[str, Any]) -> Any:
    """Instantiate a kio entity of any version from ``values``: keys the version lacks are
    dropped; lists of dicts become tuples of the nested entity class."""
    nested = _NESTED.get(cls)
    if nested is None:
        nested = _NESTED[cls] = _nested_classes(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in values.items():
        if k not in names:
            continue
        if k in nested:
            v = tuple(build(nested[k], item) for item in v)
        elif isinstance(v, list):
            v = tuple(v)
        kwargs[k] = v
    return cls(**kwargs)


def encode_body(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


@cache
def _flexible_header(cls: type) -> bool:
    """Whether ``cls`` answers with response header v1 (correlation id, empty tagged fields)
    rather than v0 (correlation id only); kio's header class for the version decides (ApiVersions
    keeps v0 in its flexible versions)."""
    header_cls = cls.__header_schema__  # type: ignore[attr-defined]  # kio adds it untyped
    names = [f.name for f in dataclasses.fields(header_cls)]
    if names != ["correlation_id"]:
        raise TypeError(f"{header_cls.__name__}: unexpected response header fields {names}")
    return bool(header_cls.__flexible__)


def frame_response(cls: type, correlation_id: int, body: bytes) -> bytes:
    """Size-prefixed response: the version's response header, then the encoded body."""
    if _flexible_header(cls):
        return struct.pack(">iib", len(body) + 5, correlation_id, 0) + body
    return struct.pack(">ii", len(body) + 4, correlation_id) + body
