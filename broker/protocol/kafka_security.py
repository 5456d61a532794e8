"""TLS and SASL/PLAIN for the broker's Kafka listener.

The security protocol is the scheme of the broker's ``listeners`` entry, as in Kafka:
``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL`` (a listener *named* otherwise maps
through ``listener.security.protocol.map`` entries ``NAME:PROTOCOL``).

* TLS (``SSL``, ``SASL_SSL``): ``ssl.certificate.location`` (PEM certificate chain) and
  ``ssl.key.location`` (PEM private key); with ``ssl.client.auth=required`` clients must present
  a certificate signed by ``ssl.ca.location`` (mutual TLS; the principal is then
  ``User:<certificate CN>``). TLS 1.2 or newer.
* SASL (``SASL_PLAINTEXT``, ``SASL_SSL``): mechanism ``PLAIN`` only. Users live in
  ``sasl.plain.users.file`` in the controller RPC's hashed format (``name:pbkdf2_sha256$...``,
  written by ``python -m kraft.rpc.auth add-user FILE NAME``): passwords are never stored, and
  checks run in constant time.

Kafka's SASL state machine per connection (:class:`SaslSession`): until authenticated, only
ApiVersions, SaslHandshake (v0–1) and SaslAuthenticate (v0–2) are served; any other request
closes the connection. A failed authentication is answered with SASL_AUTHENTICATION_FAILED and
the connection is closed after the answer, as Kafka does.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode as KafkaError

from broker.protocol.kafka_codec import (
    DecodeError,
    Reader,
    RequestHeader,
    build,
    encode_body,
    frame_response,
    response_class,
)
from kraft.config import is_loopback
from kraft.rpc.auth import AuthError, CredentialStore, principal_of

log = logging.getLogger(__name__)

API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE = 17, 36
SASL_APIS: dict[int, tuple[int, int]] = {API_SASL_HANDSHAKE: (0, 1), API_SASL_AUTHENTICATE: (0, 2)}
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
ERR_NONE = KafkaError.none
ERR_UNSUPPORTED_SASL_MECHANISM = KafkaError.unsupported_sasl_mechanism
ERR_ILLEGAL_SASL_STATE = KafkaError.illegal_sasl_state
ERR_SASL_AUTHENTICATION_FAILED = KafkaError.sasl_authentication_failed
MAX_AUTH_BYTES = 4096


class SecurityConfigError(ValueError):
    """A listener security setting that cannot be used (named in the message)."""


@dataclass(frozen=True)
class ListenerSecurity:
    """How one Kafka listener protects its connections."""

    protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    users: CredentialStore | None = None

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")


def protocol_of(listener_name: str, protocol_map: str = "") -> str:
    """The security protocol of a listener named ``listener_name`` (its own name when that is
    a protocol, else its ``listener.security.protocol.map`` entry)."""
    mapping = {}
    for item in filter(None, (p.strip() for p in protocol_map.split(","))):
        name, _, proto = item.partition(":")
        mapping[name.strip().upper()] = proto.strip().upper()
    proto = mapping.get(listener_name.upper(), listener_name.upper())
    if proto not in PROTOCOLS:
        raise SecurityConfigError(
            f"listener {listener_name!r}: unknown security protocol {proto!r} "
            f"(one of {', '.join(PROTOCOLS)}, or map it with "
            "listener.security.protocol.map)"
        )
    return proto


def listener_security(protocol: str, settings: dict[str, Any]) -> ListenerSecurity:
    """Build the listener's TLS context and SASL user store from broker settings (raises
    :class:`SecurityConfigError` naming the key that is missing or unusable)."""
    context = _ssl_context(settings) if protocol in ("SSL", "SASL_SSL") else None
    users = None
    if protocol.startswith("SASL_"):
        mechanisms = [
            m.strip().upper()
            for m in str(settings.get("sasl.enabled.mechanisms") or "PLAIN").split(",")
        ]
        if mechanisms != ["PLAIN"]:
            raise SecurityConfigError(
                f"sasl.enabled.mechanisms: only PLAIN is supported, not {mechanisms}"
            )
        path = settings.get("sasl.plain.users.file") or ""
        if not path:
            raise SecurityConfigError(
                f"{protocol} needs sasl.plain.users.file (hashed users; "
                "python -m kraft.rpc.auth add-user FILE NAME)"
            )
        try:
            users = CredentialStore.load(path)
        except (AuthError, OSError) as e:
            raise SecurityConfigError(f"sasl.plain.users.file: {e}") from None
    return ListenerSecurity(protocol, context, users)


def _ssl_context(settings: dict[str, Any]) -> ssl.SSLContext:
    cert, key = (
        settings.get("ssl.certificate.location") or "",
        settings.get("ssl.key.location") or "",
    )
    if not cert or not key:
        raise SecurityConfigError(
            "an SSL listener needs ssl.certificate.location and ssl.key.location (PEM)"
        )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise SecurityConfigError(
            f"ssl.certificate.location/ssl.key.location: cannot load {cert} / {key}: {e}"
        ) from None
    client_auth = str(settings.get("ssl.client.auth") or "none").lower()
    if client_auth not in ("none", "requested", "required"):
        raise SecurityConfigError(
            f"ssl.client.auth must be none, requested or required, not {client_auth!r}"
        )
    if client_auth != "none":
        ca = settings.get("ssl.ca.location") or ""
        if not ca or not Path(ca).is_file():
            raise SecurityConfigError("ssl.client.auth needs ssl.ca.location (PEM CA certificates)")
        ctx.load_verify_locations(ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if client_auth == "required" else ssl.CERT_OPTIONAL
    return ctx


def tls_principal(peer_cert: dict[str, Any] | None) -> str | None:
    """``User:<CN>`` of a verified client certificate (mutual TLS), else None."""
    for rdn in (peer_cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return principal_of(value)
    return None


class SaslClose(Exception):
    """Close the connection (after sending ``response`` when it is not None)."""

    def __init__(self, response: bytes | None, why: str) -> None:
        super().__init__(why)
        self.response = response


class SaslSession:
    """One connection's SASL/PLAIN state: handshake, then authenticate, then anything."""

    def __init__(self, users: CredentialStore) -> None:
        self.users = users
        self.principal: str | None = None
        self._mechanism_ok = False
        self._handshake_version = -1

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def allows(self, api_key: int) -> bool:
        """Whether a request with ``api_key`` may be served in the current state."""
        return self.authenticated or api_key in (18, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE)

    def handle(self, header: RequestHeader, reader: Reader) -> bytes:
        """Answer a SaslHandshake or SaslAuthenticate request (raises :class:`SaslClose`)."""
        if header.api_key == API_SASL_HANDSHAKE:
            return self._handshake(header, reader)
        return self._authenticate(header, reader)

    def _handshake(self, header: RequestHeader, reader: Reader) -> bytes:
        mechanism = reader.string() or ""
        cls = response_class(API_SASL_HANDSHAKE, header.api_version)
        if self.authenticated or self._mechanism_ok:
            body = encode_body(
                build(cls, {"error_code": ERR_ILLEGAL_SASL_STATE, "mechanisms": ["PLAIN"]})
            )
            raise SaslClose(
                frame_response(cls, header.correlation_id, body), "second SaslHandshake"
            )
        if mechanism.upper() != "PLAIN":
            body = encode_body(
                build(cls, {"error_code": ERR_UNSUPPORTED_SASL_MECHANISM, "mechanisms": ["PLAIN"]})
            )
            raise SaslClose(
                frame_response(cls, header.correlation_id, body),
                f"unsupported SASL mechanism {mechanism!r}",
            )
        self._mechanism_ok = True
        self._handshake_version = header.api_version
        body = encode_body(build(cls, {"error_code": ERR_NONE, "mechanisms": ["PLAIN"]}))
        return frame_response(cls, header.correlation_id, body)

    def _authenticate(self, header: RequestHeader, reader: Reader) -> bytes:
        version = header.api_version
        if version >= 2:
            n = reader.uvarint() - 1
        else:
            n = reader.int32()
        if n < 0 or n > MAX_AUTH_BYTES:
            raise DecodeError(f"SaslAuthenticate auth_bytes length {n}")
        token = reader.take(n)
        cls = response_class(API_SASL_AUTHENTICATE, version)

        def answer(code: int, message: str | None) -> bytes:
            values: dict[str, Any] = {
                "error_code": code,
                "error_message": message,
                "auth_bytes": b"",
            }
            if version >= 1:
                values["session_lifetime"] = timedelta(0)
            return frame_response(cls, header.correlation_id, encode_body(build(cls, values)))

        if not self._mechanism_ok or self.authenticated:
            raise SaslClose(
                answer(
                    ERR_ILLEGAL_SASL_STATE, "SaslHandshake with mechanism PLAIN must come first"
                ),
                "SaslAuthenticate out of order",
            )
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise SaslClose(
                answer(ERR_SASL_AUTHENTICATION_FAILED, "Invalid SASL/PLAIN token"),
                "malformed PLAIN token",
            )
        _authzid, username, password = parts
        try:
            name, secret = username.decode("utf-8"), password.decode("utf-8")
        except UnicodeDecodeError:
            name, secret = "", ""
        principal = self.users.verify(name, secret) if name and secret else None
        if principal is None:
            log.warning("Kafka SASL/PLAIN authentication failed for user %r", name[:64])
            raise SaslClose(
                answer(
                    ERR_SASL_AUTHENTICATION_FAILED,
                    "Authentication failed: Invalid username or password",
                ),
                "authentication failed",
            )
        self.principal = principal
        log.info("Kafka client authenticated as %s", principal)
        return answer(ERR_NONE, None)


def authenticates(security: ListenerSecurity, settings: dict[str, Any]) -> bool:
    """Whether a listener knows who every client is (SASL, or TLS requiring a certificate)."""
    if security.sasl:
        return True
    return security.tls and str(settings.get("ssl.client.auth") or "none").lower() == "required"


def check_listeners_authenticate(config: Any, security: dict[str, ListenerSecurity]) -> None:
    """Refuse (``SecurityConfigError``) a listener bound to a non-loopback address that does not
    authenticate its clients, unless ``allow.insecure.listeners=true``: anyone on the network
    could produce, fetch and delete."""
    for name, host, port in config.listeners:
        if is_loopback(host) or authenticates(security[name], config.values):
            continue
        if config["allow.insecure.listeners"]:
            log.warning(
                "listener %s://%s:%d does not authenticate clients and is reachable from other "
                "hosts (allow.insecure.listeners=true)",
                name,
                host,
                port,
            )
        else:
            raise SecurityConfigError(
                f"listeners: {name}://{host}:{port} is reachable from other hosts and does not "
                f"authenticate clients ({security[name].protocol}): use SASL_PLAINTEXT, SASL_SSL "
                "or SSL with ssl.client.auth=required, bind it to 127.0.0.1, or set "
                "allow.insecure.listeners=true to accept that"
            )
