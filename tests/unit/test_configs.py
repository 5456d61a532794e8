"""Config definitions and validation (types, rules, canonical values, unknown keys)."""

import pytest

from kraft.controller.configs import BROKER_CONFIGS, TOPIC_CONFIGS, split_list, validate_value
from kraft.errors import ErrorCode, KraftError
from kraft.records import RESOURCE_BROKER, RESOURCE_TOPIC


def invalid(key, value, resource=RESOURCE_TOPIC):
    with pytest.raises(KraftError) as e:
        validate_value(resource, key, value)
    assert e.value.code == ErrorCode.INVALID_CONFIG
    return e.value.message


@pytest.mark.parametrize(
    "key, value, canonical",
    [
        ("cleanup.policy", "compact", "compact"),
        ("cleanup.policy", " delete , compact ", "delete,compact"),
        ("retention.ms", "-1", "-1"),
        ("retention.ms", " 1000 ", "1000"),
        ("retention.bytes", "-5", "-5"),
        ("segment.bytes", "14", "14"),
        ("min.insync.replicas", "2", "2"),
        ("max.message.bytes", "0", "0"),
        ("unclean.leader.election.enable", "TRUE", "true"),
        ("compression.type", "zstd", "zstd"),
        ("message.timestamp.type", "LogAppendTime", "LogAppendTime"),
        ("segment.ms", "1", "1"),
        ("flush.messages", "1", "1"),
        ("min.cleanable.dirty.ratio", "0.25", "0.25"),
        ("preallocate", "false", "false"),
    ],
)
def test_valid_topic_values_are_canonical(key, value, canonical):
    assert validate_value(RESOURCE_TOPIC, key, value) == canonical


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("retention.ms", "-2", "at least -1"),
        ("retention.ms", "soon", "integer"),
        ("segment.bytes", "13", "at least 14"),
        ("segment.bytes", str(2**31), "fit in a int"),
        ("min.insync.replicas", "0", "at least 1"),
        ("cleanup.policy", "shred", "may only contain delete, compact"),
        ("cleanup.policy", "", "at least one"),
        ("cleanup.policy", "delete,delete", "repeat"),
        ("unclean.leader.election.enable", "yes", "true or false"),
        ("compression.type", "brotli", "must be one of"),
        ("message.timestamp.type", "Now", "must be one of"),
        ("min.cleanable.dirty.ratio", "1.5", "between 0 and 1"),
        ("min.cleanable.dirty.ratio", "nan", "finite"),
        ("segment.ms", "0", "at least 1"),
        ("flush.messages", "0", "at least 1"),
    ],
)
def test_bad_values_name_key_and_rule(key, value, fragment):
    message = invalid(key, value)
    assert key in message and fragment in message


def test_unknown_key_is_invalid_config():
    assert "no.such.key" in invalid("no.such.key", "1")
    assert "retention.ms" in invalid(
        "retention.ms", "1", RESOURCE_BROKER
    )  # a topic key, not a broker one


def test_non_string_value_is_invalid_config():
    assert "string" in invalid("retention.ms", 5)


def test_broker_configs():
    assert validate_value(RESOURCE_BROKER, "log.retention.ms", "1000") == "1000"
    assert validate_value(RESOURCE_BROKER, "num.io.threads", "4") == "4"
    invalid("num.io.threads", "0", RESOURCE_BROKER)


def test_defaults_are_valid_and_synonyms_exist():
    for d in TOPIC_CONFIGS.values():
        validate_value(RESOURCE_TOPIC, d.name, d.default)
        assert d.synonym is None or d.synonym in BROKER_CONFIGS
    for d in BROKER_CONFIGS.values():
        validate_value(RESOURCE_BROKER, d.name, d.default)


def test_split_list():
    assert split_list(None) == []
    assert split_list(" a, ,b ") == ["a", "b"]
