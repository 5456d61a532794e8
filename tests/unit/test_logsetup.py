"""Node logging: the level in any case, env over config, clear errors, a rotated file."""

import logging

import pytest

from broker.config import BrokerConfig
from kraft import logsetup
from kraft.config import ConfigError
from tests.unit.broker_properties import MINIMAL_BROKER


def test_level_names_in_any_case() -> None:
    assert logsetup.parse_level("debug", "x") == logging.DEBUG
    assert logsetup.parse_level(" Info ", "x") == logging.INFO
    assert logsetup.parse_level("warn", "x") == logging.WARNING
    with pytest.raises(logsetup.LogLevelError, match="KRAFT_LOG_LEVEL='loud'"):
        logsetup.parse_level("loud", "KRAFT_LOG_LEVEL")


def test_environment_overrides_the_configured_level() -> None:
    assert logsetup.level_from({}, None) == logging.INFO
    assert logsetup.level_from({}, "error") == logging.ERROR
    assert logsetup.level_from({"KRAFT_LOG_LEVEL": "debug"}, "error") == logging.DEBUG


def test_broker_config_checks_log_settings() -> None:
    base = MINIMAL_BROKER
    try:
        config = BrokerConfig.from_properties({**base, "log.level": "debug"})
    except ConfigError as e:  # the base lacks a required key of this version: say which
        pytest.fail(f"base broker config rejected: {e}")
    assert config["log.level"] == "DEBUG"
    with pytest.raises(ConfigError, match="log.level"):
        BrokerConfig.from_properties({**base, "log.level": "chatty"})


def test_log_file_rotates(tmp_path) -> None:
    path = tmp_path / "node.log"
    root = logging.getLogger()
    before = root.level
    try:
        logsetup.configure(logging.INFO, str(path), max_bytes=2_000, backup_count=2)
        for i in range(200):
            logging.getLogger("kraft.test").info("line %d with some padding to fill the file", i)
        files = sorted(p.name for p in tmp_path.iterdir())
        assert files == ["node.log", "node.log.1", "node.log.2"]
        assert all(p.stat().st_size <= 2_000 for p in tmp_path.iterdir())
        assert "line 199" in path.read_text()
    finally:
        logsetup.configure(before)
