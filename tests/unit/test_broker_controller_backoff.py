"""The broker's retry pace towards the controllers (Kafka's ``controller.quorum.retry.backoff.ms``
and a cap): defaults, and bad values refused."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from kraft.config import ConfigError

BASE = {
    "node.id": "101",
    "process.roles": "broker",
    "cluster.id": "abc",
    "controller.quorum.bootstrap.servers": "127.0.0.1:9093",
    "listeners": "PLAINTEXT://127.0.0.1:9092",
    "log.dirs": "/tmp/x",
}


def test_defaults_and_bad_values() -> None:
    config = BrokerConfig.from_properties(BASE)
    assert config["controller.quorum.retry.backoff.ms"] == 20
    assert config["controller.quorum.retry.backoff.max.ms"] == 200
    for key in ("controller.quorum.retry.backoff.ms", "controller.quorum.retry.backoff.max.ms"):
        with pytest.raises(ConfigError, match=key):
            BrokerConfig.from_properties({**BASE, key: "0"})
