"""Replication over any listener protocol (pure parts): the follower's client security is built
from the broker's own settings, a SASL inter-broker listener needs the broker's credentials, and
replication.only.listeners must name listeners."""

from __future__ import annotations

import ssl

import pytest

from broker.config import BrokerConfig
from broker.protocol.kafka_client_security import client_security
from broker.protocol.kafka_security import SecurityConfigError
from kraft.config import ConfigError
from kraft.rpc.auth import ClientCredentials

BROKER = ClientCredentials("broker", "broker-password")
BASE = {
    "node.id": "101",
    "process.roles": "broker",
    "cluster.id": "abc",
    "controller.quorum.bootstrap.servers": "127.0.0.1:9093",
    "listeners": "CLIENT://127.0.0.1:9092,REPLICATION://127.0.0.1:9091",
    "listener.security.protocol.map": "CLIENT:SASL_SSL,REPLICATION:SASL_PLAINTEXT",
    "log.dirs": "/tmp/x",
}


def test_plaintext_needs_nothing() -> None:
    sec = client_security("PLAINTEXT", {}, None)
    assert not sec.tls and not sec.sasl and sec.ssl_context is None and sec.credentials is None


def test_sasl_logs_in_as_the_broker_and_only_when_sasl() -> None:
    assert client_security("SASL_PLAINTEXT", {}, BROKER).credentials == BROKER
    assert client_security("SSL", {}, BROKER).credentials is None  # TLS only: no login
    with pytest.raises(SecurityConfigError, match=r"controller\.rpc\.client\.credentials\.file"):
        client_security("SASL_SSL", {}, None)


def test_tls_verifies_the_leader() -> None:
    sec = client_security("SASL_SSL", {}, BROKER)
    assert sec.ssl_context is not None
    assert sec.ssl_context.verify_mode == ssl.CERT_REQUIRED and sec.ssl_context.check_hostname
    with pytest.raises(SecurityConfigError, match="ssl.ca.location"):
        client_security("SSL", {"ssl.ca.location": "/nonexistent/ca.pem"}, None)


def test_replication_only_listeners_must_exist() -> None:
    config = BrokerConfig.from_properties(
        {
            **BASE,
            "replication.only.listeners": "REPLICATION",
            "inter.broker.listener.name": "REPLICATION",
        }
    )
    assert config["replication.only.listeners"] == "REPLICATION"
    assert config["replication.principals"] == "User:broker"
    with pytest.raises(ConfigError, match="replication.only.listeners"):
        BrokerConfig.from_properties({**BASE, "replication.only.listeners": "REPL"})
