"""The broker's retry pace towards the controllers (Kafka's ``controller.quorum.retry.backoff.ms``
and a cap): defaults, and bad values refused."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from kraft.config import ConfigError
from tests.unit.broker_properties import MINIMAL_BROKER


def test_defaults_and_bad_values() -> None:
    config = BrokerConfig.from_properties(MINIMAL_BROKER)
    assert config["controller.quorum.retry.backoff.ms"] == 20
    assert config["controller.quorum.retry.backoff.max.ms"] == 200
    for key in ("controller.quorum.retry.backoff.ms", "controller.quorum.retry.backoff.max.ms"):
        with pytest.raises(ConfigError, match=key):
            BrokerConfig.from_properties({**MINIMAL_BROKER, key: "0"})
