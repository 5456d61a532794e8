"""Kafka listener security building blocks: listener protocols, TLS settings, and the SASL/PLAIN
state machine driven with real request bytes and answered with real Kafka responses."""

from __future__ import annotations

import struct
import subprocess

import pytest
from kio.schema.errors import ErrorCode as KafkaError
from kio.serial import entity_reader

from broker.protocol.kafka_codec import read_header, response_class
from broker.protocol.kafka_security import (
    SaslClose,
    SaslSession,
    SecurityConfigError,
    listener_security,
    protocol_of,
    tls_principal,
)
from kraft.rpc.auth import CredentialStore, hash_password


def _request(api_key: int, version: int, corr: int, body: bytes, flexible: bool) -> bytes:
    head = struct.pack(">hhih", api_key, version, corr, 4) + b"test"
    return head + (b"\x00" if flexible else b"") + body


def _string(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def _auth_body(token: bytes, version: int) -> bytes:
    if version >= 2:
        n, out = len(token) + 1, bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                break
        return bytes(out) + token + b"\x00"
    return struct.pack(">i", len(token)) + token


def _decode(api_key: int, version: int, frame: bytes):
    flexible = api_key == 36 and version >= 2
    start = 4 + 4 + (1 if flexible else 0)  # size, correlation id, header tags
    return entity_reader(response_class(api_key, version))(frame, start)[0]


@pytest.fixture(scope="module")
def users(tmp_path_factory) -> CredentialStore:
    path = tmp_path_factory.mktemp("users") / "users"
    path.write_text(f"alice:{hash_password('s3cret', iterations=1000)}\n")
    return CredentialStore.load(path)


def _call(session: SaslSession, api_key: int, version: int, body: bytes):
    header, reader = read_header(
        _request(api_key, version, 7, body, api_key == 36 and version >= 2)
    )
    return _decode(api_key, version, session.handle(header, reader))


@pytest.mark.parametrize("auth_version", [0, 1, 2])
def test_plain_handshake_then_authenticate(users, auth_version):
    s = SaslSession(users)
    assert not s.allows(3) and s.allows(18) and s.allows(17) and s.allows(36)
    hs = _call(s, 17, 1, _string("PLAIN"))
    assert hs.error_code == KafkaError.none and hs.mechanisms == ("PLAIN",)
    ok = _call(s, 36, auth_version, _auth_body(b"\x00alice\x00s3cret", auth_version))
    assert ok.error_code == KafkaError.none
    assert s.authenticated and s.principal == "User:alice" and s.allows(0)


def test_wrong_password_unknown_user_and_bad_token_close_with_an_answer(users):
    for token in (b"\x00alice\x00nope", b"\x00mallory\x00s3cret", b"alice-s3cret"):
        s = SaslSession(users)
        _call(s, 17, 1, _string("PLAIN"))
        with pytest.raises(SaslClose) as e:
            _call(s, 36, 2, _auth_body(token, 2))
        resp = _decode(36, 2, e.value.response)
        assert resp.error_code == KafkaError.sasl_authentication_failed
        assert not s.authenticated and not s.allows(0)


def test_out_of_order_and_unsupported_mechanism(users):
    s = SaslSession(users)
    with pytest.raises(SaslClose) as e:
        _call(s, 36, 1, _auth_body(b"\x00alice\x00s3cret", 1))
    assert _decode(36, 1, e.value.response).error_code == KafkaError.illegal_sasl_state
    with pytest.raises(SaslClose) as e:
        _call(SaslSession(users), 17, 1, _string("SCRAM-SHA-256"))
    resp = _decode(17, 1, e.value.response)
    assert resp.error_code == KafkaError.unsupported_sasl_mechanism and resp.mechanisms == (
        "PLAIN",
    )


def test_protocols_and_settings(tmp_path, users):
    assert protocol_of("PLAINTEXT") == "PLAINTEXT" and protocol_of("sasl_ssl") == "SASL_SSL"
    assert protocol_of("CLIENT", "CLIENT:SASL_PLAINTEXT,REPL:SSL") == "SASL_PLAINTEXT"
    with pytest.raises(SecurityConfigError, match="listener.security.protocol.map"):
        protocol_of("CLIENT")
    with pytest.raises(SecurityConfigError, match="sasl.plain.users.file"):
        listener_security("SASL_PLAINTEXT", {})
    with pytest.raises(SecurityConfigError, match="ssl.certificate.location"):
        listener_security("SSL", {})
    with pytest.raises(SecurityConfigError, match="only PLAIN"):
        listener_security("SASL_PLAINTEXT", {"sasl.enabled.mechanisms": "SCRAM-SHA-512"})
    assert listener_security("PLAINTEXT", {}).ssl_context is None
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=broker",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    sec = listener_security(
        "SASL_SSL",
        {
            "ssl.certificate.location": str(cert),
            "ssl.key.location": str(key),
            "sasl.plain.users.file": users.source,
        },
    )
    assert sec.tls and sec.sasl and sec.ssl_context is not None and sec.users is not None
    with pytest.raises(SecurityConfigError, match="cannot load"):
        listener_security(
            "SSL", {"ssl.certificate.location": str(key), "ssl.key.location": str(cert)}
        )
    assert tls_principal({"subject": ((("commonName", "app-1"),),)}) == "User:app-1"
    assert tls_principal(None) is None
