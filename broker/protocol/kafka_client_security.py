"""The client side of the Kafka listener security protocols, for broker-to-broker connections.

A follower's replica fetcher dials the leader's ``inter.broker.listener.name`` listener with that
listener's security protocol: ``SSL`` and ``SASL_SSL`` wrap the TCP stream in TLS (the leader's
certificate verified against ``ssl.ca.location``, or the system's CAs when it is empty, and its
advertised host checked; the broker's own ``ssl.certificate.location`` / ``ssl.key.location``
are presented when set, for listeners with ``ssl.client.auth=required``). ``SASL_PLAINTEXT``
and ``SASL_SSL`` then log in with SASL/PLAIN (SaslHandshake v1, SaslAuthenticate v1) as the
broker's own user (``controller.rpc.client.credentials.file``: the same ``User:broker`` the
controllers know), before any other request.
"""

from __future__ import annotations

import ssl
import struct
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from broker.protocol.kafka_codec import Reader
from broker.protocol.kafka_security import (
    API_SASL_AUTHENTICATE,
    API_SASL_HANDSHAKE,
    PROTOCOLS,
    SecurityConfigError,
)
from kraft.rpc.auth import ClientCredentials

SASL_HANDSHAKE_VERSION = SASL_AUTHENTICATE_VERSION = 1  # non-flexible, as the fetcher speaks


class Requester(Protocol):
    """What :func:`sasl_login` needs of a connection: one request, its response body."""

    async def request(self, api_key: int, version: int, body: bytes, timeout: float) -> Reader:
        """Send one request and read its response."""
        ...


class LoginError(ConnectionError):
    """The leader refused our SASL login (the message says why; never the password)."""


@dataclass(frozen=True)
class ClientSecurity:
    """How a broker connects to another broker's listener."""

    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    credentials: ClientCredentials | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    async def wrap(self, stream: trio.abc.Stream, host: str) -> trio.abc.Stream:
        """``stream`` inside TLS (handshake done) when the protocol says so."""
        if self.ssl_context is None:
            return stream
        tls = trio.SSLStream(stream, self.ssl_context, server_hostname=host)
        await tls.do_handshake()
        return tls


def client_security(
    protocol: str, settings: dict[str, Any], credentials: ClientCredentials | None
) -> ClientSecurity:
    """The :class:`ClientSecurity` for dialing a ``protocol`` listener of another broker, from
    this broker's settings (raises :class:`SecurityConfigError` naming what is missing)."""
    if protocol not in PROTOCOLS:
        raise SecurityConfigError(f"unknown security protocol {protocol!r}")
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        ca = settings.get("ssl.ca.location") or ""
        try:
            if ca:
                context.load_verify_locations(ca)
            cert, key = (
                settings.get("ssl.certificate.location") or "",
                settings.get("ssl.key.location") or "",
            )
            if cert and key:
                context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise SecurityConfigError(
                f"inter-broker TLS: cannot load ssl.ca.location / certificate: {e}"
            ) from None
    if protocol.startswith("SASL_") and credentials is None:
        raise SecurityConfigError(
            f"inter.broker.listener.name is a {protocol} listener: the broker logs in to the "
            "other brokers with its own user, so set controller.rpc.client.credentials.file "
            "(username=broker, password=...) and list that user in sasl.plain.users.file"
        )
    return ClientSecurity(protocol, context, credentials if protocol.startswith("SASL_") else None)


async def sasl_login(conn: Requester, credentials: ClientCredentials, timeout: float) -> None:
    """SASL/PLAIN over ``conn`` (raises :class:`LoginError` if the leader refuses)."""
    mechanism = b"PLAIN"
    r = await conn.request(
        API_SASL_HANDSHAKE,
        SASL_HANDSHAKE_VERSION,
        struct.pack(">h", len(mechanism)) + mechanism,
        timeout,
    )
    error = r.int16()
    if error:
        raise LoginError(f"SaslHandshake PLAIN refused (error {error})")
    token = b"\x00" + credentials.username.encode() + b"\x00" + credentials.password.encode()
    r = await conn.request(
        API_SASL_AUTHENTICATE,
        SASL_AUTHENTICATE_VERSION,
        struct.pack(">i", len(token)) + token,
        timeout,
    )
    error = r.int16()
    if error:
        message = r.string()
        raise LoginError(
            f"SASL/PLAIN login as {credentials.username!r} refused (error {error}: {message})"
        )
