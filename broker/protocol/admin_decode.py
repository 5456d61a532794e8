"""Decoding admin requests with kio, as leniently as Kafka: trailing bytes after the body are
ignored, and so are tagged fields the schema does not declare.

kio's reader refuses unknown tagged fields. None of the admin request versions served declares
any, so when kio refuses, :func:`strip_tagged_fields` walks the request's schema once, copying
the body without the contents of its tagged-field sections, and kio reads that instead.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from functools import cache
from typing import Any

from kio.serial import entity_reader

from broker.protocol.kafka_codec import DecodeError, Reader, RequestHeader, request_class

_FIXED = {"bool": 1, "int8": 1, "int16": 2, "int32": 4, "timedelta_i32": 4, "int64": 8, "uuid": 16}


@dataclasses.dataclass(frozen=True)
class _Field:
    kafka_type: str | None  # primitive type, or None for an entity
    entity: type | None  # item/field entity class
    array: bool


@cache
def _fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        options = list(typing.get_args(hint)) if isinstance(hint, types.UnionType) else [hint]
        option = next(o for o in options if o is not type(None))
        array = typing.get_origin(option) is tuple
        item = typing.get_args(option)[0] if array else option
        entity = typing.cast(type, item) if dataclasses.is_dataclass(item) else None
        kafka_type = f.metadata.get("kafka_type")
        if entity is None and kafka_type not in (*_FIXED, "string"):
            raise DecodeError(f"{cls.__name__}.{f.name}: unsupported field type {kafka_type!r}")
        out.append(_Field(kafka_type, entity, array))
    return tuple(out)


class _Copier:
    """Copies a flexible request body, leaving out what its tagged-field sections hold."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.r = Reader(data, pos)
        self.out = bytearray()
        self.mark = pos

    def _flush(self) -> None:
        self.out += self.r.data[self.mark : self.r.pos]
        self.mark = self.r.pos

    def _skip(self, n: int) -> None:
        if self.r.pos + n > len(self.r.data):
            raise DecodeError(f"truncated request: need {n} bytes at {self.r.pos}")
        self.r.pos += n

    def primitive(self, kafka_type: str) -> None:
        if kafka_type == "string":
            self._skip(max(self.r.uvarint() - 1, 0))  # compact (nullable) string
        else:
            self._skip(_FIXED[kafka_type])

    def entity(self, cls: type) -> None:
        for f in _fields(cls):
            count = self.r.array_len(True) if f.array else 1
            for _ in range(max(count, 0)):
                if f.entity is not None:
                    self.entity(f.entity)
                else:
                    self.primitive(f.kafka_type or "")
        self._flush()
        self.r.skip_tags()
        self.mark = self.r.pos
        self.out += b"\x00"  # an empty tagged-field section


def strip_tagged_fields(cls: type, data: bytes, pos: int) -> bytes:
    """The flexible body of ``cls`` at ``data[pos:]`` with every tagged-field section emptied."""
    copier = _Copier(data, pos)
    copier.entity(cls)
    return bytes(copier.out)


@cache
def _schema(api_key: int, version: int) -> tuple[Any, Any]:
    """The request class of (API, version) and its kio reader."""
    cls = request_class(api_key, version)
    return cls, entity_reader(cls)


def decode_request(header: RequestHeader, reader: Reader) -> Any:
    """The kio request entity for this header's API and version, read like Kafka reads it."""
    try:
        cls, read = _schema(header.api_key, header.api_version)
    except Exception as e:
        raise DecodeError(f"API {header.api_key} v{header.api_version}: no schema ({e})") from None
    try:
        return read(reader.data, reader.pos)[0]
    except Exception as e:  # kio raises several types (KeyError, ValueError, ...) on bad input
        first = e
    if cls.__flexible__ and isinstance(first, KeyError):  # kio: "Unknown tagged field tag: N"
        body = strip_tagged_fields(cls, reader.data, reader.pos)
        try:
            return read(body, 0)[0]
        except Exception as e:
            first = e
    raise DecodeError(
        f"API {header.api_key} v{header.api_version}: {type(first).__name__}: {first}"
    )
