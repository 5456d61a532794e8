"""Kafka's topic name rules (docs/kraft-notes.md, Create topics)."""

import pytest

from kraft.controller.topic_names import (
    MAX_NAME_LENGTH,
    find_collision,
    unify_collision_chars,
    validate_topic_name,
)
from kraft.errors import ErrorCode, KraftError


@pytest.mark.parametrize("name", ["a", "orders", "A-b_c.d", "x" * MAX_NAME_LENGTH, "...", "0"])
def test_legal_names(name):
    assert validate_topic_name(name) == name


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("", "empty"),
        (".", "cannot be"),
        ("..", "cannot be"),
        ("x" * (MAX_NAME_LENGTH + 1), "longer than 249"),
        ("with space", "illegal"),
        ("slash/", "illegal"),
        ("ünïcode", "illegal"),
        ("tab\t", "illegal"),
    ],
)
def test_illegal_names_say_why(name, fragment):
    with pytest.raises(KraftError) as e:
        validate_topic_name(name)
    assert e.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert fragment in e.value.message


def test_non_string_name_is_invalid():
    with pytest.raises(KraftError) as e:
        validate_topic_name(None)
    assert e.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_collision_between_dot_and_underscore():
    existing = {"metrics.cpu", "plain"}
    assert find_collision("metrics_cpu", existing.__contains__, lambda: existing) == "metrics.cpu"
    assert find_collision("metrics.cpu", existing.__contains__, lambda: existing) is None  # itself
    assert find_collision("plain", existing.__contains__, lambda: existing) is None
    assert find_collision("other_x", existing.__contains__, lambda: existing) is None


def test_collision_for_names_with_many_collision_chars_scans():
    other = "a." * 12 + "z"
    name = unify_collision_chars(other)
    existing = {other, "b"}
    assert find_collision(name, existing.__contains__, lambda: existing) == other
