"""A small blocking Kafka protocol client built on kio, for the CLI (``kraft groups``) and tests:
one request, one response, over a plain TCP connection to one broker."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from broker.protocol.kafka_admin import build_entity


class KafkaWireError(OSError):
    """The broker closed the connection or answered something unreadable."""


class KafkaWire:
    """One connection to ``host:port``; :meth:`call` sends a request and reads its answer."""

    def __init__(
        self, host: str, port: int, timeout: float = 10.0, client_id: str = "kraft-cli"
    ) -> None:
        self.address = (host, port)
        self.client_id = client_id
        self.sock = socket.create_connection(self.address, timeout=timeout)
        self.sock.settimeout(timeout)
        self._correlation = 0

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def call(self, api_key: int, version: int, values: dict[str, Any], response: Any = None) -> Any:
        """Send request ``api_key`` v``version`` filled from ``values``; the kio response (read
        as ``response``, a kio-style entity class, when given)."""
        cls = load_request_schema(api_key, version)
        self._correlation += 1
        buf = io.BytesIO()
        head_cls = cls.__header_schema__
        entity_writer(head_cls)(
            buf,
            build_entity(
                head_cls,
                {
                    "request_api_key": api_key,
                    "request_api_version": version,
                    "correlation_id": self._correlation,
                    "client_id": self.client_id,
                },
            ),
        )
        entity_writer(cls)(buf, build_entity(cls, values))
        data = buf.getvalue()
        self.sock.sendall(struct.pack(">i", len(data)) + data)
        frame = self._read_frame()
        resp_cls = response or load_response_schema(api_key, version)
        header, used = entity_reader(resp_cls.__header_schema__)(frame, 0)
        if header.correlation_id != self._correlation:
            raise KafkaWireError(
                f"correlation id {header.correlation_id}, expected {self._correlation}"
            )
        return entity_reader(resp_cls)(frame, used)[0]

    def _read_exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise KafkaWireError(f"{self.address[0]}:{self.address[1]} closed the connection")
            out += chunk
        return bytes(out)

    def _read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._read_exactly(4))
        return self._read_exactly(size)
